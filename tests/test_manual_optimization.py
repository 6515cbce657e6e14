"""Manual optimization (`automatic_optimization = False`, `self.manual_step`) on both engines: each update sees the
weights the one before it wrote, each optimizer keeps its own loss scale and skips alone, a run resumes exactly,
and mistakes are clear errors."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.precision import MixedPrecision
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.both_backends

QUIET = {"logger": False, "enable_progress_bar": False, "enable_checkpointing": False}


def to_numpy(value) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


class ManualRegressor(Regressor):
    """The Regressor, its one update made by hand."""

    automatic_optimization = False

    def training_step(self, batch):
        return self.manual_step(lambda: super(ManualRegressor, self).training_step(batch), self.optimizers())


def test_one_manual_step_trains_exactly_as_automatic_optimization():
    data = regression_data(64)
    automatic, manual = Regressor(optimizer="adam"), ManualRegressor(optimizer="adam")
    kt.Trainer(max_epochs=2, batch_size=16, seed=0, **QUIET).fit(automatic, train_data=data, shuffle=False)
    trainer = kt.Trainer(max_epochs=2, batch_size=16, seed=0, **QUIET)
    trainer.fit(manual, train_data=data, shuffle=False)
    assert trainer.global_step == 8
    for ours, theirs in zip(manual.model.get_weights(), automatic.model.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


class TwoStage(kt.Module):
    """prediction = b * (a * x): `a` and `b` each with an optimizer of its own, updated one after the other."""

    automatic_optimization = False

    def __init__(self, bad_batch: int | None = None):
        super().__init__()
        self.bad_batch = bad_batch

    def build(self):
        constant = keras.initializers.Constant
        return keras.Sequential([keras.Input((1,)),
                                 keras.layers.Dense(1, use_bias=False, kernel_initializer=constant(0.5), name="a"),
                                 keras.layers.Dense(1, use_bias=False, kernel_initializer=constant(2.0), name="b",
                                                    dtype="float32")])

    def configure_optimizers(self):
        return {"a": keras.optimizers.SGD(0.1), "b": keras.optimizers.Adam(0.1)}

    def training_step(self, batch):
        x, y = batch
        a, b = self.model.get_layer("a"), self.model.get_layer("b")
        optimizers = self.optimizers()

        def squared_error():
            return keras.ops.mean(keras.ops.square(self.model(x, training=True)[:, 0] - y))

        first = self.manual_step(squared_error, optimizers["a"], a.trainable_variables)
        if self.bad_batch is None:
            second = self.manual_step(squared_error, optimizers["b"], b.trainable_variables)
        else:  # a loss that never sees the data: only the first update meets the bad batch
            second = self.manual_step(lambda: keras.ops.mean(keras.ops.square(b.kernel - 3.0)), optimizers["b"],
                                      b.trainable_variables)
        self.log("train/first", first)
        return first + second


def two_stage_data(n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(-1.0, 1.0, n, dtype=np.float32)[:, None]
    return x, (3.0 * x[:, 0]).astype(np.float32)


def test_each_update_sees_the_weights_the_update_before_it_wrote():
    x, y = two_stage_data()
    module = TwoStage()
    kt.Trainer(max_steps=1, batch_size=8, **QUIET).fit(module, train_data=(x, y), shuffle=False)
    x = x[:, 0].astype(np.float64)
    a, b = 0.5, 2.0
    a_after = a - 0.1 * np.mean(2 * (b * a * x - y) * b * x)  # SGD on a
    gradient_b = np.mean(2 * (b * a_after * x - y) * a_after * x)  # at the a the first update wrote
    b_after = b - 0.1 * np.sign(gradient_b)  # Adam's first step moves by the rate, in the gradient's direction
    kernel_a, kernel_b = (to_numpy(w).item() for w in module.model.get_weights())
    assert kernel_a == pytest.approx(a_after, abs=1e-6)
    assert kernel_b == pytest.approx(b_after, abs=1e-5)


class Snapshots(kt.callbacks.Callback):
    def __init__(self):
        self.kernels, self.scales, self.skipped = [], [], []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.kernels.append([to_numpy(w).copy() for w in module.model.get_weights()])
        self.scales.append([float(to_numpy(optimizer.dynamic_scale)) for optimizer in trainer.optimizers])
        self.skipped.append(trainer.skipped_steps)


def test_under_16_mixed_only_the_update_with_a_non_finite_gradient_is_skipped():
    x, y = two_stage_data(32)
    x[2 * 8 + 3, 0] = np.inf  # batch 2 gives the first update non-finite gradients, the second none
    snapshots = Snapshots()
    trainer = kt.Trainer(max_epochs=1, batch_size=8, precision=MixedPrecision("16-mixed", initial_scale=1024.0),
                         callbacks=[snapshots], **QUIET)
    trainer.fit(TwoStage(bad_batch=2), train_data=(x, y), shuffle=False)
    (a1, b1), (a2, b2) = snapshots.kernels[1], snapshots.kernels[2]
    assert np.array_equal(a2, a1)  # skipped: bit-identical
    assert not np.array_equal(b2, b1)  # its own update went on
    assert snapshots.scales == [[1024.0, 1024.0], [1024.0, 1024.0], [512.0, 1024.0], [512.0, 1024.0]]
    assert snapshots.skipped == [0, 0, 1, 1] and trainer.global_step == 4


def test_a_manual_run_resumed_mid_epoch_ends_as_the_straight_run(tmp_path):
    data = two_stage_data(48)
    straight = TwoStage()
    kt.Trainer(max_epochs=2, batch_size=8, seed=0, **QUIET).fit(straight, train_data=data)

    def trainer(**limits):
        return kt.Trainer(batch_size=8, seed=0, default_root_dir=str(tmp_path), logger=False,
                          enable_progress_bar=False, **limits)

    trainer(max_steps=4).fit(TwoStage(), train_data=data)
    resumed = TwoStage()
    finished = trainer(max_epochs=2)
    finished.fit(resumed, train_data=data, ckpt_path="last")
    assert finished.global_step == 12
    for ours, theirs in zip(resumed.model.get_weights(), straight.model.get_weights(), strict=True):
        np.testing.assert_allclose(to_numpy(ours), to_numpy(theirs), rtol=0, atol=1e-6)


class TwoOptimizersAutomatic(kt.Module):
    def build(self):
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    def configure_optimizers(self):
        return [keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)]

    def training_step(self, batch):
        return keras.ops.mean(self.model(batch[0]))


def fit_one_step(module: kt.Module) -> None:
    data = (np.zeros((8, 2), np.float32), np.zeros(8, np.float32))
    kt.Trainer(max_steps=1, **QUIET).fit(module, train_data=data)


def test_several_optimizers_need_manual_optimization_and_say_so():
    with pytest.raises(TypeError, match="returned 2 optimizers.*automatic_optimization = False.*self.manual_step"):
        fit_one_step(TwoOptimizersAutomatic())


class ForgetsToUpdate(TwoOptimizersAutomatic):
    automatic_optimization = False


def test_manual_optimization_without_any_update_is_an_error():
    with pytest.raises(ValueError, match="training_step made no update.*self.manual_step"):
        fit_one_step(ForgetsToUpdate())


class ForeignOptimizer(TwoOptimizersAutomatic):
    automatic_optimization = False

    def __init__(self):
        super().__init__()
        self.foreign = keras.optimizers.SGD(0.1)

    def training_step(self, batch):
        return self.manual_step(lambda: keras.ops.mean(self.model(batch[0])), self.foreign)


def test_an_optimizer_configure_optimizers_did_not_return_is_an_error():
    with pytest.raises(ValueError, match="optimizer that configure_optimizers\\(\\) did not return"):
        fit_one_step(ForeignOptimizer())


def test_manual_step_outside_manual_optimization_says_how_to_turn_it_on():
    module = TwoOptimizersAutomatic()
    with pytest.raises(RuntimeError, match="set automatic_optimization = False in TwoOptimizersAutomatic"):
        module.manual_step(lambda: 0.0, None)
