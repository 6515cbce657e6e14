"""The Callback base: hooks run in the documented order; state_dict round-trips."""

from __future__ import annotations

import inspect

import pytest

import ktrainer as kt
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
