"""Keras callbacks in a ktrainer run: they see Keras's names, change the real optimizer, stop the run; the ones
that cannot work are refused with ktrainer's equivalent."""

from __future__ import annotations

import csv

import keras
import numpy as np
import pytest

import ktrainer as kt
from tests.helpers import Classifier, read_scalars

pytestmark = pytest.mark.both_backends


def trainer(root, *callbacks, **kwargs):
    kwargs.setdefault("logger", False)
    return kt.Trainer(batch_size=64, default_root_dir=str(root), enable_progress_bar=False, callbacks=list(callbacks),
                      **kwargs)


class LearningRates(kt.callbacks.Callback):
    def __init__(self):
        self.rates = []

    def on_train_epoch_end(self, trainer, module):
        self.rates.append(float(keras.ops.convert_to_numpy(trainer.optimizer.learning_rate)))


def test_reduce_lr_on_plateau_lowers_the_real_learning_rate_as_tensorboard_shows(tmp_path):
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0, min_delta=10.0)
    rates = LearningRates()
    run = trainer(tmp_path, plateau, rates, max_epochs=3, logger=True, log_every_n_steps=1)
    run.fit(Classifier())
    # The first epoch improves on "no value yet"; every later one fails to improve by 10: halved each time.
    assert rates.rates == pytest.approx([0.01, 0.005, 0.0025])
    logged = read_scalars(str(tmp_path / "tensorboard" / "version_0"))["lr-Adam"]
    assert logged[0][1] == pytest.approx(0.01) and logged[-1][1] == pytest.approx(0.005)  # the rate epoch 3 used


def test_a_resumed_reduce_lr_on_plateau_continues_its_count_though_keras_resets_it_at_train_begin(tmp_path):
    def plateau():  # every epoch after the first fails to improve by 10; two such epochs halve the rate
        return keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2, min_delta=10.0)

    straight = LearningRates()
    trainer(tmp_path / "straight", plateau(), straight, max_epochs=4).fit(Classifier())
    assert straight.rates == pytest.approx([0.01, 0.01, 0.005, 0.005])
    trainer(tmp_path / "run", plateau(), max_epochs=2).fit(Classifier())  # stops with one epoch waited
    resumed = LearningRates()
    trainer(tmp_path / "run", plateau(), resumed, max_epochs=4).fit(Classifier(), ckpt_path="last")
    assert resumed.rates == pytest.approx([0.005, 0.005])


def test_a_checkpoint_keeps_what_a_keras_callback_counted_and_the_resuming_script_gives_its_settings():
    saved = kt.callbacks.keras_adapter.KerasCallback(keras.callbacks.ReduceLROnPlateau(patience=2, min_delta=10.0))
    saved.callback.wait, saved.callback.best, saved.callback.min_delta = 1, 0.5, -10.0  # as after a first compare
    state = saved.state_dict()
    assert state == {"wait": 1, "best": 0.5, "cooldown_counter": 0}
    resuming = kt.callbacks.keras_adapter.KerasCallback(keras.callbacks.ReduceLROnPlateau(patience=5, min_delta=1.0))
    resuming.load_state_dict({**state, "patience": 2, "min_delta": -10.0})  # an earlier version saved settings too
    assert (resuming.callback.wait, resuming.callback.patience, resuming.callback.min_delta) == (1, 5, 1.0)


class LastEpochWeights(kt.callbacks.Callback):
    def on_train_epoch_end(self, trainer, module):
        self.weights = [np.array(w) for w in module.model.get_weights()]


def test_keras_early_stopping_keeps_its_best_weights_across_a_resume_and_last_holds_the_trained_ones(tmp_path):
    def stopper():  # the first epoch is the best (later ones never improve by 10); it never stops early
        return keras.callbacks.EarlyStopping(monitor="val_loss", patience=5, min_delta=10.0, restore_best_weights=True)

    straight, trained = Classifier(), LastEpochWeights()
    at_the_end = kt.callbacks.ModelCheckpoint(every_n_epochs=2)  # the third epoch is saved by save_last
    trainer(tmp_path / "straight", stopper(), trained, at_the_end, max_epochs=3, seed=0).fit(straight)
    last = Classifier()
    trainer(tmp_path / "straight").validate(last, ckpt_path="last")
    for saved, end_of_training in zip(last.model.get_weights(), trained.weights, strict=True):
        np.testing.assert_array_equal(saved, end_of_training)  # "last": what training ended with, not the best

    trainer(tmp_path / "run", stopper(), max_epochs=2, seed=0).fit(Classifier())
    resumed = Classifier()
    trainer(tmp_path / "run", stopper(), max_epochs=3, seed=0).fit(resumed, ckpt_path="last")
    for got, expected in zip(resumed.model.get_weights(), straight.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)  # both restored the first epoch's weights


def test_keras_early_stopping_with_restore_best_weights_restores_them():
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0, restore_best_weights=True)
    weights = []
    keep = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: weights.append(
        [np.array(w) for w in module.model.get_weights()]))
    module = Classifier()
    run = trainer("runs", keep, stopper, max_epochs=10, enable_checkpointing=False)
    run.fit(module)
    assert run.current_epoch == 2  # epoch 0 best; epoch 1 no improvement by 10: stop
    for restored, best in zip(module.model.get_weights(), weights[0], strict=True):
        np.testing.assert_array_equal(restored, best)


def test_our_early_stopping_restores_the_best_weights_and_a_checkpoint_keeps_them(tmp_path):
    stopper = kt.callbacks.EarlyStopping(monitor="val/loss", patience=1, min_delta=10.0, restore_best_weights=True)
    module = Classifier()
    run = trainer(tmp_path, stopper, max_epochs=10)
    run.fit(module)
    assert run.current_epoch == 2 and stopper.best_weights is not None
    for restored, best in zip(module.model.get_weights(), stopper.best_weights, strict=True):
        np.testing.assert_array_equal(restored, best)
    again = kt.callbacks.EarlyStopping(monitor="val/loss", patience=1, min_delta=10.0, restore_best_weights=True)
    trainer(tmp_path, again, max_epochs=2).fit(Classifier(), ckpt_path="last")  # only loads: nothing left to train
    for saved, best in zip(again.best_weights, stopper.best_weights, strict=True):
        np.testing.assert_array_equal(saved, best)


def schedule(epoch, rate):
    return 0.1 * 0.5**epoch


def test_learning_rate_scheduler_sets_each_epochs_rate_and_a_resumed_run_keeps_the_schedule(tmp_path):
    straight = LearningRates()
    trainer(tmp_path / "straight", keras.callbacks.LearningRateScheduler(schedule), straight, max_epochs=3).fit(
        Classifier())
    assert straight.rates == pytest.approx([0.1, 0.05, 0.025])
    trainer(tmp_path / "run", keras.callbacks.LearningRateScheduler(schedule), max_epochs=2).fit(Classifier())
    resumed = LearningRates()
    trainer(tmp_path / "run", keras.callbacks.LearningRateScheduler(schedule), resumed, max_epochs=3).fit(
        Classifier(), ckpt_path="last")
    assert resumed.rates == pytest.approx([0.025])


def test_keras_names_in_logs_csv_logger_and_terminate_on_nan(tmp_path):
    seen = []
    logger = keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    lam = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(dict(logs)))
    trainer("runs", lam, logger, max_epochs=2, enable_checkpointing=False).fit(Classifier())
    assert {"loss", "val_loss", "val_acc", "train/loss_epoch", "val/loss"} <= set(seen[0])
    assert seen[0]["loss"] == seen[0]["train/loss_epoch"] and seen[0]["val_loss"] == seen[0]["val/loss"]
    with open(tmp_path / "log.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and float(rows[1]["val_loss"]) == pytest.approx(seen[1]["val_loss"])

    class Diverging(Classifier):
        def training_step(self, batch):
            return super().training_step(batch) * np.nan

    run = trainer("runs", keras.callbacks.TerminateOnNaN(), max_epochs=5, enable_checkpointing=False)
    run.fit(Diverging())
    assert run.global_step == 1  # stopped at the first NaN loss


@pytest.mark.parametrize(("callback", "equivalent"), [
    (keras.callbacks.BackupAndRestore("backup"), "Remove it: ktrainer's own checkpoints already resume a run "
                                                 "exactly, mid-epoch too. To resume, pass ckpt_path=\"last\": "
                                                 "trainer.fit(module, ckpt_path=\"last\")."),
    (keras.callbacks.ModelCheckpoint("model.keras"), "Use kt.callbacks.ModelCheckpoint instead"),
    (keras.callbacks.TensorBoard(), "Use kt.loggers.TensorBoardLogger instead"),
    (keras.callbacks.ProgbarLogger(), "Use the Trainer's own progress bar instead"),
    (keras.callbacks.History(), "Use the History that trainer.fit(...) returns instead"),
])
def test_keras_callbacks_that_cannot_work_here_are_refused_naming_the_equivalent(callback, equivalent):
    with pytest.raises(ValueError) as refused:
        kt.Trainer(callbacks=[callback])
    message = str(refused.value)
    assert message.startswith(f"callbacks: keras.callbacks.{type(callback).__name__} cannot work in a ktrainer run. ")
    assert equivalent in message
