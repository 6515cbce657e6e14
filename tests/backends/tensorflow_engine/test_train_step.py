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
from ktrainer.step.outputs import APPLIED, BATCH_SIZE, SKIPPED
from tests.backends.train_step_checks import (
    PreparedStep,
    check_a_saved_group_restores_and_flushes_as_its_mean,
    sgd_from_zero,
)
from tests.helpers import Regressor


class Prepared(PreparedStep):
    """A Regressor prepared on this process's device in batches of 4; `run` is one compiled execution."""

    def __init__(self, module: Regressor | None = None, accumulate: int = 1) -> None:
        super().__init__(TensorFlowEngine(plan_devices()), module, accumulate, batch_size=4)
        self.runner = self.engine.train_runner(self.step, self.keys)

    def run(self, batches: int) -> dict[str, np.ndarray]:
        """`batches` batches of 4 in one compiled execution."""
        return self.runner.run(self.engine.batches(self.source), batches)


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
    assert prepared.run(2)[APPLIED].tolist() == [0, 0]
    check_a_saved_group_restores_and_flushes_as_its_mean(prepared, lambda: Prepared(accumulate=3))


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
