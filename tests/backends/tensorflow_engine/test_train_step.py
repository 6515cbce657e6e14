"""The TensorFlow training step through its compiled runner: one execution is one SGD step computed by hand, a partial
accumulation group is counted, saved, restored into a new step and flushed as its mean, a loss that reaches no
variable is refused naming the fix, and sparse gradients stay sparse in the helpers that read them.

Whole fits on several replicas are test_multi_device.py's.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from ktrainer.backends.tensorflow.devices import plan_devices
from ktrainer.backends.tensorflow.engine import TensorFlowEngine
from ktrainer.backends.tensorflow.gradients import dense, values
from ktrainer.building import build_model, build_optimizers
from ktrainer.data import BatchSource
from ktrainer.precision import Precision
from ktrainer.step_outputs import APPLIED, BATCH_SIZE, SKIPPED
from tests.helpers import Regressor, regression_data

LR = 0.1


class Prepared:
    """A module built on this process's device, its prepared training step and compiled runner."""

    def __init__(self, module: Regressor | None = None, accumulate: int = 1) -> None:
        self.module = module or Regressor(lr=LR)
        self.engine = TensorFlowEngine(plan_devices())
        self.engine.start()
        precision = Precision()
        build_model(self.module, precision, [], self.engine)
        built = build_optimizers(self.module, precision, self.engine, None)
        self.step = self.engine.train_step(self.module, built.wrapped, built.configured, precision,
                                           gradient_clip_val=None, accumulate_grad_batches=accumulate)
        self.x, self.y = regression_data(8)
        self.source = BatchSource((self.x, self.y), 4)
        self.keys = self.engine.prepare_train_step(self.step, self.source)
        self.runner = self.engine.train_runner(self.step, self.keys)

    def run(self, batches: int) -> dict[str, np.ndarray]:
        """`batches` batches of 4 in one compiled execution."""
        return self.runner.run(self.engine.batches(self.source), batches)

    def kernel(self) -> np.ndarray:
        return np.asarray(self.module.model.layers[-1].kernel.numpy())


def sgd_from_zero(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The kernel after one SGD step on mean((x @ w + b - y)^2) from w = 0, b = 0."""
    return (LR * 2.0 * x.T @ y / len(y))[:, None]


def test_one_execution_of_one_batch_is_one_sgd_step_with_its_loss_and_bookkeeping():
    prepared = Prepared()
    assert prepared.keys == ["train/loss", BATCH_SIZE, APPLIED, SKIPPED]
    outputs = prepared.run(1)
    x, y = prepared.x[:4], prepared.y[:4]
    assert outputs["train/loss"].tolist() == pytest.approx([float(np.mean(y**2))], rel=1e-6)
    assert (outputs[BATCH_SIZE].tolist(), outputs[APPLIED].tolist(), outputs[SKIPPED].tolist()) == ([4], [1], [0])
    np.testing.assert_allclose(prepared.kernel(), sgd_from_zero(x, y), rtol=1e-5, atol=1e-7)
    assert int(prepared.step.rules[0].optimizer.iterations.numpy()) == 1


def test_a_partial_accumulation_group_is_counted_saved_restored_and_flushed_as_its_mean():
    prepared = Prepared(accumulate=3)
    outputs = prepared.run(2)
    assert outputs[APPLIED].tolist() == [0, 0]
    assert prepared.step.pending() == 2
    assert not np.any(prepared.kernel())
    saved = prepared.step.state_dict()
    assert list(saved) == ["00"]

    resumed = Prepared(accumulate=3)
    assert resumed.step.mismatch(saved) == ""
    resumed.step.load_state_dict(saved)
    assert resumed.step.pending() == 2
    assert resumed.step.flush() == (True, False)
    # the group's mean over the two halves of the 8 examples is the gradient of all 8
    np.testing.assert_allclose(resumed.kernel(), sgd_from_zero(prepared.x, prepared.y), rtol=1e-5, atol=1e-7)
    assert resumed.step.pending() == 0 and resumed.step.state_dict() == {}
    assert resumed.step.flush() == (False, False)


class Detached(Regressor):
    """A training step whose loss does not depend on the model."""

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(y))


def test_a_loss_that_reaches_no_variable_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"No gradient reaches any variable .* Compute the loss from self.model"):
        Prepared(Detached()).run(1)


def test_the_gradient_helpers_read_a_sparse_gradient_without_making_it_dense():
    sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([2]), tf.constant([4, 2]))
    assert values(sparse) is sparse.values
    dense_tensor = tf.constant([[1.0, 2.0]])
    assert values(dense_tensor) is dense_tensor
    np.testing.assert_array_equal(dense(sparse).numpy(), [[0, 0], [0, 0], [1, 2], [0, 0]])
