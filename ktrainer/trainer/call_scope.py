"""Everything around one fit/validate/test/predict call: before it, the call's state, the seed and the setup hooks;
on every way out (success, an error, Ctrl-C, preemption), the loggers finalized, the teardown hooks, the engine
synced and the user's dtype policy restored."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import keras

from ktrainer.callbacks.callback_list import call_hook, in_hook_order
from ktrainer.compat.keras_internals import tensorflow_left_alone
from ktrainer.loop.trainer_state import TrainerState
from ktrainer.utils.logs import quietly

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["call_scope"]


@contextlib.contextmanager
def call_scope(trainer: Trainer, stage: str, module: Module) -> Iterator[None]:
    """Run the body of one Trainer call on `module` for `stage` ("fit", "validate", "test" or "predict").

    On an error, every callback's `on_exception` runs and the loggers are finalized as "failed"
    ("interrupted" for KeyboardInterrupt); a clean-up that fails then is a warning, so the
    user's error surfaces unchanged.
    """
    previous_policy = keras.config.dtype_policy()
    trainer.state = TrainerState(stage=stage)
    trainer.should_stop, trainer.stop_reason = False, None
    module.trainer, trainer.module = trainer, module
    status = "success"
    try:
        trainer.engine.start()
        if stage == "fit":
            trainer.precision.reset()
            if trainer.seed is not None:
                with tensorflow_left_alone():  # on JAX, TensorFlow is seeded only if the user imported it
                    keras.utils.set_random_seed(trainer.seed)
        module.setup(stage)
        call_hook(trainer.callbacks, "setup", trainer, module, stage)
        yield
    except BaseException as error:
        status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        for callback in in_hook_order(trainer.callbacks, "on_exception"):
            quietly(callback.on_exception, trainer, module, error)
        raise
    finally:
        try:
            for each in trainer.reporter.writing_loggers:
                if status == "success":
                    each.finalize(status)
                else:
                    quietly(each.finalize, status)
            for callback in trainer.callbacks:
                quietly(callback.teardown, trainer, module, stage)
            quietly(module.teardown, stage)
        finally:
            quietly(trainer.engine.sync)
            keras.config.set_dtype_policy(previous_policy)
            trainer.state.stage = ""
