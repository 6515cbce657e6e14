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
