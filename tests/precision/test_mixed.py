"""Loss scaling under "16-mixed": skipped steps leave everything bit-identical, the scale moves, stalls stop."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.precision import MixedPrecision, TrainingStalledError
from tests.helpers import Classifier, Regressor, read_scalars, regression_data

pytestmark = pytest.mark.both_backends


class HalfRegressor(Regressor):
    """A float16 hidden layer (under "16-mixed") and a float32 output layer."""

    def build(self):
        return keras.Sequential([keras.layers.Input((self.features,)), keras.layers.Dense(8, activation="tanh"),
                                 keras.layers.Dense(1, dtype="float32")])


class Snapshots(kt.callbacks.Callback):
    """After every step: weights, the inner optimizer's variables, the loss scale, the skip count."""

    def __init__(self):
        self.weights, self.slots, self.scales, self.skips = [], [], [], []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.weights.append([w.numpy().copy() for w in module.model.weights])
        self.slots.append([v.numpy().copy() for v in trainer.optimizer.inner_optimizer.variables])
        self.scales.append(float(trainer.optimizer.dynamic_scale.numpy()))
        self.skips.append(trainer.skipped_steps)


def data_with_a_bad_batch(bad_batch: int, batches: int = 6, batch_size: int = 8):
    x, y = regression_data(batches * batch_size)
    x[bad_batch * batch_size + 1, 0] = np.inf  # one example: its loss and every gradient become non-finite
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]  # in order


def _same(a, b):
    return all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def test_a_non_finite_gradient_is_skipped_bit_identically_and_training_continues(quiet):
    snapshots = Snapshots()
    trainer = kt.Trainer(max_epochs=1, batch_size=8, precision=MixedPrecision("16-mixed", initial_scale=1024.0),
                         callbacks=[snapshots], **quiet)
    trainer.fit(HalfRegressor(optimizer="adam", lr=0.01), train_data=data_with_a_bad_batch(bad_batch=3))
    bad, before = 3, 2
    assert _same(snapshots.weights[bad], snapshots.weights[before])  # weights bit-identical
    assert _same(snapshots.slots[bad], snapshots.slots[before])  # Adam's moments and iteration count too
    assert snapshots.skips == [0, 0, 0, 1, 1, 1]
    assert snapshots.scales == [1024.0, 1024.0, 1024.0, 512.0, 512.0, 512.0]
    assert not _same(snapshots.weights[bad + 1], snapshots.weights[bad])  # and it keeps training
    assert int(trainer.optimizer.iterations.numpy()) == 5
    assert trainer.global_step == 6  # global_step counts attempted steps, skipped ones included


def test_the_scale_grows_after_growth_interval_finite_steps(quiet):
    snapshots = Snapshots()
    precision = MixedPrecision("16-mixed", initial_scale=4.0, growth_interval=2)
    trainer = kt.Trainer(max_epochs=1, batch_size=8, precision=precision, callbacks=[snapshots], **quiet)
    x, y = regression_data(40)
    trainer.fit(HalfRegressor(), train_data=(x, y))
    assert snapshots.scales == [4.0, 8.0, 8.0, 16.0, 16.0]


def test_users_own_loss_scale_optimizer_is_kept(quiet):
    class OwnScaler(HalfRegressor):
        def configure_optimizers(self):
            return keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=64.0,
                                                            dynamic_growth_steps=1000)

    trainer = kt.Trainer(max_steps=2, batch_size=8, precision="16-mixed", **quiet)
    module = OwnScaler()
    trainer.fit(module, train_data=regression_data(32))
    assert float(trainer.optimizer.dynamic_scale.numpy()) == 64.0
    assert trainer.callback_metrics["precision/loss_scale"] == 64.0


def test_a_loss_scale_optimizer_under_full_precision_is_unwrapped_with_a_warning(quiet):
    class OwnScaler(Regressor):
        def configure_optimizers(self):
            return keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1))

    trainer = kt.Trainer(max_steps=1, batch_size=8, **quiet)
    with pytest.warns(UserWarning, match="needs no loss scaling; the Trainer uses its inner optimizer"):
        trainer.fit(OwnScaler(), train_data=regression_data(32))
    assert isinstance(trainer.optimizer, keras.optimizers.SGD)


def test_accumulation_skips_the_whole_group_with_a_bad_batch(quiet):
    snapshots = Snapshots()
    trainer = kt.Trainer(max_epochs=1, batch_size=8, accumulate_grad_batches=2, callbacks=[snapshots],
                         precision=MixedPrecision("16-mixed", initial_scale=256.0), **quiet)
    trainer.fit(HalfRegressor(optimizer="adam"), train_data=data_with_a_bad_batch(bad_batch=2))
    assert trainer.global_step == 3 and trainer.skipped_steps == 1
    assert _same(snapshots.weights[3], snapshots.weights[1])  # batches 2-3 form the skipped group
    assert int(trainer.optimizer.iterations.numpy()) == 2


class AlwaysNaN(HalfRegressor):
    def training_step(self, batch):
        return super().training_step(batch) * keras.ops.convert_to_tensor(float("nan"))


def test_a_window_of_skipped_steps_stops_with_advice(quiet):
    precision = MixedPrecision("16-mixed", initial_scale=2.0**15, stall_window=5, min_loss_scale=0.0)
    trainer = kt.Trainer(max_epochs=10, batch_size=8, precision=precision, **quiet)
    with pytest.raises(TrainingStalledError, match=r"last 5 optimizer steps were all skipped.*precision='32-true'"):
        trainer.fit(AlwaysNaN(), train_data=regression_data(64))
    assert trainer.global_step == 5 and trainer.skipped_steps == 5


def test_a_loss_scale_below_the_floor_stops_with_advice(quiet):
    precision = MixedPrecision("16-mixed", initial_scale=4.0, stall_window=1000, min_loss_scale=1.0)
    trainer = kt.Trainer(max_epochs=10, batch_size=8, precision=precision, **quiet)
    with pytest.raises(TrainingStalledError, match=r"loss scale fell to 0.5, below the floor 1.*bf16-mixed"):
        trainer.fit(AlwaysNaN(), train_data=regression_data(64))
    assert trainer.global_step == 3


def test_loss_scale_and_skipped_steps_reach_tensorboard_and_the_bar(tmp_path):
    trainer = kt.Trainer(max_epochs=1, batch_size=8, log_every_n_steps=2, default_root_dir=str(tmp_path),
                         precision=MixedPrecision("16-mixed", initial_scale=1024.0), enable_progress_bar=False)
    trainer.fit(HalfRegressor(optimizer="adam"), train_data=data_with_a_bad_batch(bad_batch=2))
    scalars = read_scalars(str(tmp_path / "tensorboard" / "version_0"))
    assert scalars["precision/loss_scale"] == [(2, 1024.0), (4, 512.0), (6, 512.0)]
    assert scalars["precision/skipped_steps"] == [(2, 0.0), (4, 1.0), (6, 1.0)]
    assert trainer.progress_bar_metrics["precision/loss_scale"] == 512.0


def test_no_loss_scale_metrics_without_loss_scaling(tmp_path):
    trainer = kt.Trainer(max_steps=4, batch_size=32, log_every_n_steps=2, default_root_dir=str(tmp_path),
                         precision="bf16-mixed", enable_progress_bar=False)
    trainer.fit(Classifier())
    scalars = read_scalars(str(tmp_path / "tensorboard" / "version_0"))
    assert not any(tag.startswith("precision/") for tag in scalars)
