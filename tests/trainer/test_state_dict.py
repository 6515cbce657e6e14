"""Trainer.state_dict and load_state_dict: the sections a checkpoint holds, a round trip that continues the same
run, and a state that does not fit refused before anything changes."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.both_backends


class Grab(kt.callbacks.Callback):
    """Takes the trainer's state_dict at one step, as numpy copies."""

    def __init__(self, at: int):
        self.at, self.state = at, None

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        if trainer.global_step == self.at:
            self.state = _numpy(trainer.state_dict())


def _numpy(state):
    if isinstance(state, dict):
        return {key: _numpy(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return [_numpy(value) for value in state]
    if hasattr(state, "shape"):
        return np.array(keras.ops.convert_to_numpy(state))
    return state


class Load(kt.callbacks.Callback):
    """Loads a state at fit start, like a resume."""

    def __init__(self, state):
        self.state = state

    def on_fit_start(self, trainer, module):
        trainer.load_state_dict(self.state)


def _weights(module):
    return [keras.ops.convert_to_numpy(v) for v in module.model.weights]


def test_the_state_has_every_section_and_needs_a_fit():
    grab = Grab(at=2)
    trainer = kt.Trainer(max_steps=3, batch_size=16, callbacks=[grab], logger=False, enable_progress_bar=False)
    trainer.fit(Regressor(optimizer="adam"), regression_data(n=64))
    assert set(grab.state) == {"model", "optimizer", "accumulation", "progress", "random", "callbacks", "loggers",
                               "precision", "metrics", "run"}
    assert grab.state["progress"]["global_step"] == 2
    assert grab.state["run"]["global_batch_size"] == 16
    assert grab.state["run"]["hparams"]["optimizer"] == "adam"
    with pytest.raises(RuntimeError, match="needs a built model and optimizer"):
        kt.Trainer(max_steps=1).state_dict()


def test_loading_a_state_continues_the_run_it_was_taken_from(quiet):
    data = regression_data(n=64)
    grab = Grab(at=2)
    straight = Regressor(optimizer="adam")
    kt.Trainer(max_steps=4, batch_size=16, seed=0, callbacks=[grab], **quiet).fit(straight, data, shuffle=False)
    resumed = Regressor(optimizer="adam")
    trainer = kt.Trainer(max_steps=4, batch_size=16, seed=0, callbacks=[Load(grab.state)], **quiet)
    trainer.fit(resumed, data, shuffle=False)
    assert trainer.global_step == 4
    for a, b in zip(_weights(straight), _weights(resumed), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_state_of_another_model_is_refused_and_nothing_is_loaded(quiet):
    grab = Grab(at=1)
    kt.Trainer(max_steps=1, batch_size=16, callbacks=[grab], **quiet).fit(Regressor(features=3),
                                                                          regression_data(n=32, features=3))
    before = []

    class Remember(kt.callbacks.Callback):
        def on_fit_start(self, trainer, module):
            before.extend(_weights(module))

    trainer = kt.Trainer(max_steps=1, batch_size=16, callbacks=[Remember(), Load(grab.state)], **quiet)
    module = Regressor(features=4)
    with pytest.raises(ValueError, match=r"does not match this model and optimizer; nothing was loaded"):
        trainer.fit(module, regression_data(n=32))
    assert trainer.global_step == 0
    for a, b in zip(before, _weights(module), strict=True):
        np.testing.assert_array_equal(a, b)
