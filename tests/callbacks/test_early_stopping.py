"""EarlyStopping: stops after `patience` checks without improvement; its state round-trips."""

from __future__ import annotations

import keras
import pytest

import ktrainer as kt
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends


class FrozenValidation(Classifier):
    """Validation loss that never improves after the first epoch."""

    def validation_step(self, batch):
        epoch = float(self.trainer.current_epoch)
        self.log("val/score", keras.ops.convert_to_tensor(min(epoch, 1.0)))


def test_stops_after_patience_checks_without_improvement(quiet):
    stopper = kt.callbacks.EarlyStopping(monitor="val/score", mode="min", patience=2)
    trainer = kt.Trainer(max_epochs=20, batch_size=128, callbacks=[stopper], **quiet)
    trainer.fit(FrozenValidation())
    # epoch 0: 0 (best); epoch 1: 1 (wait 1); epoch 2: 1 (wait 2 -> stop).
    assert trainer.current_epoch == 3
    assert stopper.stopped_epoch == 2
    assert stopper.state_dict() == {"best": 0.0, "wait": 2, "stopped_epoch": 2}


def test_mode_max_and_min_delta(quiet):
    stopper = kt.callbacks.EarlyStopping(monitor="val/acc", mode="max", patience=1, min_delta=2.0)
    trainer = kt.Trainer(max_epochs=10, batch_size=128, callbacks=[stopper], **quiet)
    trainer.fit(Classifier())
    assert trainer.current_epoch == 2  # accuracy can never improve by 2.0


def test_a_training_epoch_metric_is_checked_once_the_epoch_logged_it(quiet):
    stopper = kt.callbacks.EarlyStopping(monitor="train/loss_epoch", patience=100)
    trainer = kt.Trainer(max_epochs=3, batch_size=32, callbacks=[stopper], **quiet)
    trainer.fit(Classifier())  # with validation data: the check waits for the epoch's own training metrics
    assert stopper.best == min(trainer.history.history["train/loss_epoch"])


class FrozenAfterFirstValidation(Classifier):
    """A validation score that never improves after the first validation."""

    def __init__(self):
        super().__init__()
        self.validations = 0

    def on_validation_epoch_end(self):
        self.log("val/score", min(float(self.validations), 1.0))
        self.validations += 1


@pytest.mark.parametrize(("rhythm", "stopped_at_step"), [
    ({"check_val_every_n_epoch": 2}, 48),  # validations at steps 16, 32, 48...: the third is the second miss
    ({"val_check_interval": 5, "check_val_every_n_epoch": None}, 15),  # every 5 batches, across epochs
])
def test_patience_counts_validations_not_epoch_ends_without_one(quiet, rhythm, stopped_at_step):
    stopper = kt.callbacks.EarlyStopping(monitor="val/score", patience=2)
    trainer = kt.Trainer(max_epochs=20, batch_size=32, callbacks=[stopper], **rhythm, **quiet)
    trainer.fit(FrozenAfterFirstValidation())
    assert stopper.state_dict()["best"] == 0.0 and stopper.wait == 2
    assert trainer.global_step == stopped_at_step


def test_a_training_epoch_metric_with_validation_inside_epochs_is_checked_at_epoch_ends_when_asked(quiet):
    asked = kt.callbacks.EarlyStopping(monitor="train/loss_epoch", patience=100, check_on_train_epoch_end=True)
    trainer = kt.Trainer(max_epochs=3, batch_size=32, val_check_interval=3, callbacks=[asked], **quiet)
    trainer.fit(Classifier())
    assert asked.best == min(trainer.history.history["train/loss_epoch"])
    unasked = kt.callbacks.EarlyStopping(monitor="train/loss_epoch")
    with pytest.raises(RuntimeError, match="checked after each validation .*check_on_train_epoch_end=True"):
        kt.Trainer(max_epochs=1, batch_size=32, val_check_interval=3, callbacks=[unasked], **quiet).fit(Classifier())


def test_missing_metric_is_an_error_naming_the_logged_ones(quiet):
    stopper = kt.callbacks.EarlyStopping(monitor="val/typo")
    with pytest.raises(RuntimeError, match=r"monitor='val/typo'.*found no such metric.*val/loss"):
        kt.Trainer(max_epochs=2, batch_size=128, callbacks=[stopper], **quiet).fit(Classifier())


def test_state_round_trip():
    stopper = kt.callbacks.EarlyStopping()
    stopper.load_state_dict({"best": 0.5, "wait": 1, "stopped_epoch": None})
    assert (stopper.best, stopper.wait) == (0.5, 1)


def test_two_early_stoppings_keep_their_own_state_through_a_checkpoint(tmp_path):
    def stoppers():
        return [kt.callbacks.EarlyStopping(monitor="val/loss", mode="min", patience=50),
                kt.callbacks.EarlyStopping(monitor="val/acc", mode="max", patience=50)]

    first = stoppers()
    kt.Trainer(max_epochs=2, batch_size=64, default_root_dir=str(tmp_path), enable_progress_bar=False, logger=False,
               callbacks=first).fit(Classifier())
    assert {s.state_key for s in first} == {"EarlyStopping{'monitor': 'val/loss', 'mode': 'min'}",
                                            "EarlyStopping{'monitor': 'val/acc', 'mode': 'max'}"}
    saved = [s.state_dict() for s in first]
    assert saved[0]["best"] != saved[1]["best"]
    second = stoppers()[::-1]  # given in the other order: keys, not positions, match them
    trainer = kt.Trainer(max_epochs=2, batch_size=64, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False, callbacks=second)
    trainer.fit(Classifier(), ckpt_path="last")  # nothing left to train: only the state is loaded
    assert [s.state_dict() for s in second[::-1]] == saved


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode='up' is not supported. Use one of: 'min', 'max'"):
        kt.callbacks.EarlyStopping(mode="up")
    with pytest.raises(ValueError, match="patience must be an int >= 0"):
        kt.callbacks.EarlyStopping(patience=-1)
