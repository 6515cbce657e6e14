"""The Callback base: hooks run in the documented order; state_dict round-trips."""

from __future__ import annotations

import inspect
import os

import pytest

import ktrainer as kt
from ktrainer.checkpoint.format import MANIFEST
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends


class Order(kt.callbacks.Callback):
    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        attribute = object.__getattribute__(self, name)
        if (name.startswith("on_") or name in ("setup", "teardown")) and callable(attribute):
            def record(*args, **kwargs):
                self.calls.append(name)
                return attribute(*args, **kwargs)
            return record
        return attribute


def test_fit_calls_hooks_in_the_documented_order(quiet):
    order = Order()
    kt.Trainer(max_epochs=2, batch_size=128, callbacks=[order], **quiet).fit(Classifier())
    epoch = ["on_train_epoch_start", "on_train_batch_start", "on_train_batch_end", "on_train_batch_start",
             "on_train_batch_end", "on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end",
             "on_validation_end", "on_train_epoch_end"]
    assert order.calls == ["setup", "on_fit_start", *epoch, *epoch, "on_train_end", "on_fit_end", "teardown"]


def test_validate_test_predict_call_their_hooks(quiet):
    order = Order()
    trainer = kt.Trainer(max_steps=1, batch_size=128, callbacks=[order], **quiet)
    module = Classifier()
    trainer.validate(module)
    trainer.test(module, data=(module.x, module.y))
    trainer.predict(module, module.x)
    assert order.calls == ["setup", "on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end",
                           "on_validation_end", "teardown",
                           "setup", "on_test_start", "on_test_epoch_start", "on_test_epoch_end", "on_test_end",
                           "teardown",
                           "setup", "on_predict_start", "on_predict_end", "teardown"]


def test_every_hook_is_documented_and_a_no_op():
    base = kt.callbacks.Callback()
    for name, member in inspect.getmembers(kt.callbacks.Callback, inspect.isfunction):
        if not name.startswith("_"):
            assert member.__doc__, name
    assert base.state_dict() == {}
    assert base.state_key == "Callback"


class Counts(kt.callbacks.Callback):
    """State a callback advances in the hooks where checkpoints are saved."""

    def __init__(self):
        self.batches = self.epochs = 0

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.batches += 1

    def on_train_epoch_end(self, trainer, module):
        self.epochs += 1

    def state_dict(self):
        return {"batches": self.batches, "epochs": self.epochs}

    def load_state_dict(self, state):
        self.batches, self.epochs = state["batches"], state["epochs"]


@pytest.mark.parametrize("save", [{"every_n_epochs": 1}, {"every_n_train_steps": 2, "every_n_epochs": None}])
def test_a_checkpoint_holds_what_the_other_callbacks_did_in_the_hook_it_was_saved_in(tmp_path, quiet, save):
    def run(max_epochs, ckpt_path=None):
        counts = Counts()
        callbacks = [kt.callbacks.ModelCheckpoint(save_last=False, **save), counts]  # the checkpoint given first
        kt.Trainer(max_epochs=max_epochs, batch_size=128, default_root_dir=str(tmp_path), callbacks=callbacks,
                   **quiet).fit(Classifier(), ckpt_path=ckpt_path)
        return counts

    run(max_epochs=2)  # saved at the end of its last epoch (or of its last step): nothing after the save
    resumed = run(max_epochs=3, ckpt_path="last")
    assert (resumed.epochs, resumed.batches) == (3, 6)  # 2 batches an epoch, as if the run had never stopped


class LooksAtTheCheckpoint(kt.callbacks.Callback):
    """What a user's callback, listed before the ModelCheckpoint, finds of it at the start and end of fit."""

    def on_fit_start(self, trainer, module):
        self.resumed_from = trainer.checkpoint_callback.resumed_from

    def on_fit_end(self, trainer, module):
        checkpoint = trainer.checkpoint_callback
        self.last_saved = checkpoint.last_saved
        self.committed = os.path.exists(os.path.join(checkpoint.last_saved, MANIFEST))
        self.exported = os.path.exists(os.path.join(checkpoint.dirpath, "export", "last.keras"))


def test_at_the_start_and_end_of_fit_other_callbacks_find_the_checkpoint_settled(tmp_path, quiet):
    def run(max_epochs, ckpt_path=None):
        looks = LooksAtTheCheckpoint()
        checkpoint = kt.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), async_save=True, export_keras=True)
        kt.Trainer(max_epochs=max_epochs, batch_size=128, callbacks=[looks, checkpoint], **quiet).fit(
            Classifier(), ckpt_path=ckpt_path)
        return looks

    first = run(max_epochs=1)
    assert first.last_saved.endswith("step-00000002") and first.committed and first.exported
    resumed = run(max_epochs=2, ckpt_path=str(tmp_path / "ckpt" / "step-00000002"))
    assert resumed.resumed_from == "step-00000002"
    assert resumed.last_saved.endswith("step-00000004") and resumed.committed
