"""The Trainer's loop: limits, counters, seeding, clipping, accumulation, steps_per_execution."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import CheckpointError
from tests.helpers import Classifier, Regressor, regression_data

pytestmark = pytest.mark.both_backends


class LossRecorder(kt.callbacks.Callback):
    """Records the step loss after every execution (steps_per_execution=1: every step)."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.losses.append(metrics["train/loss_step"])


def test_quickstart_contract(tmp_path):
    trainer = kt.Trainer(max_epochs=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False)
    module = Classifier()
    trainer.fit(module)
    assert isinstance(module.model, keras.Model)
    assert (trainer.global_step, trainer.current_epoch) == (16, 2)  # 256 examples / 32 = 8 steps per epoch
    metrics = trainer.validate(module)
    assert set(metrics) == {"val/acc", "val/loss"}
    assert all(isinstance(v, float) for v in metrics.values())
    predictions = trainer.predict(module, module.x[:50])
    assert predictions.shape == (50, 3)
    eager = keras.ops.convert_to_numpy(module.model(module.x[:50]))
    np.testing.assert_allclose(predictions, eager, rtol=1e-5, atol=1e-6)


def test_training_reduces_the_loss(quiet):
    module = Classifier()
    trainer = kt.Trainer(max_epochs=5, batch_size=32, seed=0, **quiet)
    first = kt.Trainer(max_steps=1, batch_size=256, **quiet).validate(Classifier())["val/loss"]
    trainer.fit(module)
    assert trainer.callback_metrics["val/loss"] < 0.7 * first


def test_max_steps_stops_mid_epoch(quiet):
    trainer = kt.Trainer(max_steps=5, batch_size=32, **quiet)
    trainer.fit(Classifier())
    assert trainer.global_step == 5
    assert trainer.current_epoch == 0
    assert trainer.progress.batch_in_epoch == 5


def test_limit_train_batches_int_and_fraction(quiet):
    trainer = kt.Trainer(max_epochs=2, batch_size=32, limit_train_batches=3, **quiet)
    trainer.fit(Classifier())
    assert (trainer.global_step, trainer.current_epoch) == (6, 2)
    trainer = kt.Trainer(max_epochs=1, batch_size=32, limit_train_batches=0.5, **quiet)
    trainer.fit(Classifier())
    assert trainer.global_step == 4


class ValidationCounter(kt.callbacks.Callback):
    def __init__(self):
        self.at_steps = []

    def on_validation_end(self, trainer, module):
        self.at_steps.append(trainer.global_step)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, [8, 16, 24]),
        ({"check_val_every_n_epoch": 2}, [16]),
        ({"val_check_interval": 3}, [3, 6, 8, 11, 14, 16, 19, 22, 24]),
        ({"val_check_interval": 0.5}, [4, 8, 12, 16, 20, 24]),
        ({"val_check_interval": 0.5, "check_val_every_n_epoch": 2}, [12, 16]),  # only in the 2nd epoch, as Lightning
        ({"val_check_interval": 5, "check_val_every_n_epoch": None}, [5, 10, 15, 20]),  # counted across epochs
        ({"val_check_interval": 4, "check_val_every_n_epoch": None}, [4, 8, 12, 16, 20, 24]),
        ({"limit_val_batches": 0}, []),
    ],
)
def test_validation_schedule(quiet, settings, expected):
    counter = ValidationCounter()
    trainer = kt.Trainer(max_epochs=3, batch_size=32, callbacks=[counter], **settings, **quiet)
    trainer.fit(Classifier())
    assert counter.at_steps == expected


def test_counting_across_epochs_keeps_its_rhythm_through_a_resume(tmp_path, quiet):
    counter = ValidationCounter()
    rhythm = {"val_check_interval": 5, "check_val_every_n_epoch": None, "default_root_dir": str(tmp_path)}
    kt.Trainer(max_epochs=3, max_steps=12, batch_size=32, callbacks=[counter], **rhythm, **quiet).fit(Classifier())
    resumed = ValidationCounter()
    kt.Trainer(max_epochs=3, batch_size=32, callbacks=[resumed], **rhythm, **quiet).fit(Classifier(), ckpt_path="last")
    assert (counter.at_steps, resumed.at_steps) == ([5, 10], [15, 20])  # stopped at epoch 1, batch 4


def test_data_of_unknown_length_ending_at_a_validation_validates_there_once(quiet):
    module = Classifier()
    batches = [(module.x[i:i + 32], module.y[i:i + 32]) for i in range(0, 256, 32)]
    counter = ValidationCounter()
    trainer = kt.Trainer(max_epochs=1, batch_size=32, val_check_interval=4, callbacks=[counter], **quiet)
    trainer.fit(module, train_data=(batch for batch in batches), val_data=(module.x, module.y))
    assert counter.at_steps == [4, 8]
    assert np.isfinite(trainer.history.history["val/loss"][0])  # the epoch's record holds that validation


def test_an_epoch_end_step_of_a_partial_group_is_validated_again(quiet):
    module = Classifier()
    batches = [(module.x[i:i + 32], module.y[i:i + 32]) for i in range(0, 192, 32)]  # 6 batches, unknown length
    counter = ValidationCounter()
    trainer = kt.Trainer(max_epochs=1, batch_size=32, val_check_interval=3, accumulate_grad_batches=4,
                         callbacks=[counter], **quiet)
    trainer.fit(module, train_data=(batch for batch in batches), val_data=(module.x, module.y))
    assert counter.at_steps == [0, 1, 2]  # batches 3 and 6, then the weights after the last group's step


def test_a_rhythm_for_validation_is_ignored_when_the_fit_has_none(quiet):
    module = Classifier()
    batches = [(module.x[i:i + 32], module.y[i:i + 32]) for i in range(0, 256, 32)]
    trainer = kt.Trainer(max_epochs=1, batch_size=32, val_check_interval=0.5, limit_val_batches=0,
                         steps_per_execution=8, **quiet)
    trainer.fit(module, train_data=(batch for batch in batches))  # a fraction of an epoch of unknown length
    assert trainer.global_step == 8


def test_a_validation_rhythm_that_cannot_run_is_refused_before_anything_is_built(tmp_path, quiet):
    module = Classifier()
    with pytest.raises(ValueError, match="val_check_interval=9 is more than the 8 training batches"):
        kt.Trainer(max_epochs=1, batch_size=32, val_check_interval=9, default_root_dir=str(tmp_path),
                   **quiet).fit(module)
    assert module.model is None and list(tmp_path.iterdir()) == []
    for interval in (None, 0.5):
        with pytest.raises(ValueError, match=f"val_check_interval must be an int; got {interval}"):
            kt.Trainer(check_val_every_n_epoch=None, val_check_interval=interval)
    kt.Trainer(check_val_every_n_epoch=None, limit_val_batches=0)  # no validation: nothing to count
    kt.Trainer(check_val_every_n_epoch=None, fast_dev_run=True)  # validates its one batch at the epoch end


def test_fast_dev_run_runs_one_batch_and_writes_nothing(tmp_path):
    counter = ValidationCounter()
    trainer = kt.Trainer(fast_dev_run=True, max_epochs=10, default_root_dir=str(tmp_path), callbacks=[counter],
                         enable_progress_bar=False)
    trainer.fit(Classifier())
    assert (trainer.global_step, trainer.current_epoch) == (1, 1)
    assert counter.at_steps == [1]
    assert list(tmp_path.iterdir()) == []


def _losses_and_weights(seed, **settings):
    recorder = LossRecorder()
    module = Classifier()
    trainer = kt.Trainer(max_epochs=2, batch_size=32, seed=seed, callbacks=[recorder],
                         enable_progress_bar=False, logger=False, **settings)
    trainer.fit(module)
    return recorder.losses, module.model.get_weights()


def test_same_seed_gives_identical_losses_and_weights():
    losses_a, weights_a = _losses_and_weights(7)
    losses_b, weights_b = _losses_and_weights(7)
    losses_c, _ = _losses_and_weights(8)
    assert losses_a == losses_b
    for a, b in zip(weights_a, weights_b, strict=True):
        np.testing.assert_array_equal(a, b)
    assert losses_a != losses_c


def test_steps_per_execution_changes_nothing_but_speed(tmp_path):
    """Per-step losses (read from the CSV log) and final weights match at 1 and 4 steps per execution."""
    results = []
    for spe in (1, 4):
        module = Classifier()
        logger = kt.loggers.CSVLogger(str(tmp_path / f"spe{spe}"))
        trainer = kt.Trainer(max_epochs=2, batch_size=32, seed=3, steps_per_execution=spe, log_every_n_steps=1,
                             logger=logger, enable_progress_bar=False)
        trainer.fit(module)
        rows = (tmp_path / f"spe{spe}" / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
        header = rows[0].split(",")
        column = header.index("train/loss_step")
        losses = [float(r.split(",")[column]) for r in rows[1:] if r.split(",")[column]]
        results.append((losses, module.model.get_weights(), trainer.global_step))
    (losses_1, weights_1, steps_1), (losses_4, weights_4, steps_4) = results
    assert steps_1 == steps_4 == 16
    assert len(losses_1) == 16
    np.testing.assert_allclose(losses_1, losses_4, rtol=1e-6)
    for a, b in zip(weights_1, weights_4, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_epoch_mean_is_weighted_by_batch_size(quiet):
    """40 examples in batches of 16, 16, 8: the epoch value is the mean over examples, not over batches."""
    x, y = regression_data(40)

    class Logger(kt.loggers.Logger):
        def __init__(self):
            super().__init__(save_dir="unused")
            self.epoch_values = []

        def log_metrics(self, metrics, step):
            if "train/first_x_epoch" in metrics:
                self.epoch_values.append(metrics["train/first_x_epoch"])

        def log_hyperparams(self, params):
            pass

    class LogsFirstFeature(Regressor):
        def training_step(self, batch):
            self.log("train/first_x", keras.ops.mean(batch[0][:, 0]), on_step=True, on_epoch=True)
            return super().training_step(batch)

    logger = Logger()
    trainer = kt.Trainer(max_epochs=1, batch_size=16, logger=logger, enable_progress_bar=False)
    trainer.fit(LogsFirstFeature(), train_data=(x, y))
    assert logger.epoch_values == [pytest.approx(float(x[:, 0].mean()), abs=1e-6)]


def test_gradient_clipping_bounds_the_update(quiet):
    """With SGD(lr=1) and clip 0.5, the first update has norm exactly 0.5 (its true norm is larger)."""
    x, y = regression_data(32)
    module = Regressor(lr=1.0)
    trainer = kt.Trainer(max_steps=1, batch_size=32, gradient_clip_val=0.5, **quiet)
    trainer.fit(module, train_data=(x, y))
    kernel, bias = module.model.get_weights()
    update = np.concatenate([kernel.ravel(), bias.ravel()])
    assert np.linalg.norm(update) == pytest.approx(0.5, rel=1e-5)
    true_gradient = np.concatenate([-2 * x.T @ y / 32, [-2 * y.mean()]])
    assert np.linalg.norm(true_gradient) > 1.0


def test_accumulation_equals_the_large_batch(quiet):
    """Two accumulated batches of 16 give the same update as one batch of 32 (MSE mean, SGD)."""
    x, y = regression_data(64)
    data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]  # batches of 8, in order
    accumulated, large = Regressor(), Regressor()
    trainer = kt.Trainer(max_epochs=1, batch_size=16, accumulate_grad_batches=2, **quiet)
    trainer.fit(accumulated, train_data=data)
    assert trainer.global_step == 2
    kt.Trainer(max_epochs=1, batch_size=32, **quiet).fit(large, train_data=data)
    for a, b in zip(accumulated.model.get_weights(), large.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_accumulation_flushes_the_last_partial_group(quiet):
    x, y = regression_data(48)
    trainer = kt.Trainer(max_epochs=1, batch_size=16, accumulate_grad_batches=2, **quiet)
    trainer.fit(Regressor(), train_data=(x, y))
    assert trainer.global_step == 2  # 3 batches: one full group of 2, then the last batch alone


def test_predict_uses_module_predict_data_and_returns_one_row_per_example(quiet):
    module = Classifier()
    trainer = kt.Trainer(max_steps=2, batch_size=32, **quiet)
    trainer.fit(module)
    module.predict_data = lambda: (module.x[:70],)
    assert trainer.predict(module).shape == (70, 3)


def test_the_default_epoch_limit_is_warned_about_at_fit_only_where_no_limit_was_set(caplog, quiet, tmp_path):
    said = "Neither max_epochs nor max_steps is set: training stops after max_epochs=1000"
    with caplog.at_level("WARNING", logger="ktrainer"):
        evaluating = kt.Trainer(batch_size=128, **quiet)
        evaluating.validate(Classifier())
        kt.Trainer(fast_dev_run=True, batch_size=128, **quiet).fit(Classifier())
    assert said not in caplog.text
    assert evaluating.max_epochs == 1000
    with caplog.at_level("WARNING", logger="ktrainer"):
        with pytest.raises(CheckpointError):  # a fit that stops at once, once it has warned
            evaluating.fit(Classifier(), ckpt_path=str(tmp_path / "no-such-checkpoint"))
    assert said in caplog.text
