"""Calling a hook on the callbacks: every one, in list order, those that run first in it first."""

from __future__ import annotations

import pytest

import ktrainer as kt
from ktrainer.callbacks.callback_list import call_hook, in_hook_order

pytestmark = pytest.mark.both_backends


def test_call_hook_calls_every_callback_in_order_with_the_arguments():
    calls = []

    class Named:
        def __init__(self, name):
            self.name = name

        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            calls.append((self.name, trainer, module, metrics, batch_idx))

    call_hook([Named("a"), Named("b")], "on_train_batch_end", "T", "M", {"x": 1.0}, 4)
    assert calls == [("a", "T", "M", {"x": 1.0}, 4), ("b", "T", "M", {"x": 1.0}, 4)]


def test_callbacks_that_run_first_in_a_hook_come_first_there_and_keep_their_place_elsewhere():
    class Plain(kt.callbacks.Callback):
        pass

    class Settles(kt.callbacks.Callback):
        runs_first_in = ("on_fit_end",)

    plain, settles, other = Plain(), Settles(), Plain()
    callbacks = [plain, settles, other]
    assert in_hook_order(callbacks, "on_fit_end") == [settles, plain, other]
    assert in_hook_order(callbacks, "on_train_batch_end") == callbacks
