"""What surrounds every Trainer call: the setup hooks before; on every way out the loggers finalized with how the call
ended, the teardown hooks, the user's dtype policy restored; on an error `on_exception` first, and a clean-up that
fails then is a warning, so the user's own error reaches them unchanged."""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.loggers import Logger
from ktrainer.trainer.call_scope import call_scope
from tests.helpers import Regressor

pytestmark = pytest.mark.both_backends


class Finalized(Logger):
    """A logger that keeps the status of each finalize (and can fail there)."""

    def __init__(self, *args, fails: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.statuses: list[str] = []
        self.fails = fails

    def log_metrics(self, metrics, step):
        pass

    def log_hyperparams(self, params):
        pass

    def finalize(self, status):
        self.statuses.append(status)
        if self.fails:
            raise OSError("the log folder is gone")


class Events(kt.callbacks.Callback):
    """A callback that keeps the order of the hooks around a call (and can fail in teardown)."""

    def __init__(self, teardown_fails: bool = False) -> None:
        self.events: list[tuple] = []
        self.teardown_fails = teardown_fails

    def setup(self, trainer, module, stage):
        self.events.append(("setup", stage, trainer.state.stage))

    def on_exception(self, trainer, module, exception):
        self.events.append(("exception", exception))

    def teardown(self, trainer, module, stage):
        self.events.append(("teardown", stage))
        if self.teardown_fails:
            raise RuntimeError("teardown failed")


class Boom(RuntimeError):
    """The user's own error."""


def scope(tmp_path, callback=None, logger=None, **arguments) -> tuple[kt.Trainer, Regressor]:
    trainer = kt.Trainer(max_steps=1, enable_progress_bar=False, default_root_dir=str(tmp_path),
                         logger=logger or Finalized(), callbacks=[callback or Events()], **arguments)
    return trainer, Regressor()


def test_a_call_that_succeeds_runs_the_setup_and_teardown_hooks_and_finalizes_its_loggers(tmp_path):
    events = Events()
    trainer, module = scope(tmp_path, events)
    trainer.should_stop, trainer.stop_reason = True, "the previous call stopped early"
    with call_scope(trainer, "validate", module):
        assert (trainer.state.stage, trainer.should_stop, trainer.stop_reason) == ("validate", False, None)
        assert module.trainer is trainer
    assert events.events == [("setup", "validate", "validate"), ("teardown", "validate")]
    assert trainer.logger.statuses == ["success"]
    assert trainer.state.stage == ""


@pytest.mark.parametrize(("error", "status"), [(Boom("user hook failed"), "failed"),
                                               (KeyboardInterrupt(), "interrupted")])
def test_an_error_is_shown_to_callbacks_then_surfaces_unchanged_after_the_clean_up(tmp_path, error, status):
    events = Events()
    trainer, module = scope(tmp_path, events)
    with pytest.raises(type(error)) as caught:
        with call_scope(trainer, "fit", module):
            raise error
    assert caught.value is error
    assert events.events[1:] == [("exception", error), ("teardown", "fit")]
    assert trainer.logger.statuses == [status]


def test_a_clean_up_that_fails_after_an_error_is_a_warning_and_the_users_error_still_surfaces(tmp_path):
    trainer, module = scope(tmp_path, Events(teardown_fails=True), Finalized(fails=True))
    with pytest.warns(UserWarning) as warned, pytest.raises(Boom, match="user hook failed"):
        with call_scope(trainer, "fit", module):
            raise Boom("user hook failed")
    messages = " ".join(str(each.message) for each in warned)
    assert "the log folder is gone" in messages and "teardown failed" in messages


def test_a_logger_that_fails_to_finalize_after_a_success_is_an_error(tmp_path):
    trainer, module = scope(tmp_path, logger=Finalized(fails=True))
    with pytest.raises(OSError, match="the log folder is gone"):
        with call_scope(trainer, "test", module):
            pass


def test_the_users_dtype_policy_is_restored_on_every_way_out(tmp_path):
    trainer, module = scope(tmp_path, precision="bf16-mixed")
    previous = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("float16")
        for body_fails in (False, True):
            with pytest.raises(Boom) if body_fails else contextlib.nullcontext():
                with call_scope(trainer, "fit", module):
                    keras.config.set_dtype_policy(trainer.precision.policy)  # as building the model does
                    if body_fails:
                        raise Boom("after the policy was set")
            assert keras.config.dtype_policy().name == "float16"
    finally:
        keras.config.set_dtype_policy(previous)


def test_fit_seeds_keras_from_the_trainers_seed_and_other_calls_do_not(tmp_path):
    def draws(stage: str) -> np.ndarray:
        trainer, module = scope(tmp_path, seed=7)
        with call_scope(trainer, stage, module):
            return keras.ops.convert_to_numpy(keras.random.uniform((4,)))

    keras.utils.set_random_seed(1)
    first = draws("fit")
    keras.random.uniform((4,))  # moves the global stream on
    np.testing.assert_array_equal(draws("fit"), first)
    keras.utils.set_random_seed(1)
    assert not np.array_equal(draws("test"), first)

