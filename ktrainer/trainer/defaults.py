"""The loggers and callbacks a Trainer gets from its arguments: the built-ins the user did not give, then theirs,
and every ModelCheckpoint last."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from ktrainer.callbacks import Callback, LearningRateMonitor, ModelCheckpoint, ProgressBar, ThroughputMonitor
from ktrainer.callbacks.keras_adapter import wrap_keras_callback
from ktrainer.loggers import Logger, TensorBoardLogger

__all__ = ["resolve_loggers", "default_callbacks"]


def resolve_loggers(logger: Any) -> list[Logger]:
    """The loggers of the `logger` argument.

    Raises:
        ValueError: For anything but True, False/None, a Logger or Loggers.
    """
    if logger is True:
        return [TensorBoardLogger()]
    if logger is False or logger is None:
        return []
    loggers = [logger] if isinstance(logger, Logger) else list(logger)
    for each in loggers:
        if not isinstance(each, Logger):
            raise ValueError(
                f"logger must be True, False, a ktrainer Logger or a list of them; got {type(each).__name__}."
            )
    return loggers


def default_callbacks(callbacks: Callback | Sequence[Callback] | None, progress_bar: bool, has_logger: bool,
                       checkpointing: bool) -> list:
    """The built-ins the user did not give (checkpoint, progress bar, LR and throughput monitors), then the given ones,
    with every ModelCheckpoint moved to the end (in their order).

    A checkpoint saved in a hook then holds what every other callback did in that hook: a counter
    advanced, a rate cut by ReduceLROnPlateau at the epoch's end. Saved before them, a resumed run would
    lose it (Lightning orders checkpoint callbacks last for the same reason). In the hooks it names in
    `runs_first_in` (the start and end of fit) a ModelCheckpoint still runs first.
    Keras callbacks are wrapped to run at their equivalent points (`callbacks/keras_adapter.py`).

    Raises:
        ValueError: For a non-callback (or something other than a callback or a list of them), a Keras
            callback that cannot work here (naming ktrainer's equivalent), or a ModelCheckpoint with
            checkpointing off.
    """
    given = _given_callbacks(callbacks)
    has_checkpoint = any(isinstance(c, ModelCheckpoint) for c in given)
    if has_checkpoint and not checkpointing:
        raise ValueError("callbacks holds a ModelCheckpoint but enable_checkpointing=False; drop one of the two.")
    defaults: list[Callback] = []
    if checkpointing and not has_checkpoint:
        defaults.append(ModelCheckpoint())
    if progress_bar and not any(isinstance(c, ProgressBar) for c in given):
        defaults.append(ProgressBar())
    if has_logger:
        defaults += _missing_monitors(given)
    ordered = defaults + given
    return ([each for each in ordered if not isinstance(each, ModelCheckpoint)]
            + [each for each in ordered if isinstance(each, ModelCheckpoint)])


def _given_callbacks(callbacks: Callback | Sequence[Callback] | None) -> list[Callback]:
    """The `callbacks` argument as a list of ktrainer callbacks, Keras ones wrapped.

    Raises:
        ValueError: For anything but a callback or a list of callbacks (ktrainer or Keras ones).
    """
    if isinstance(callbacks, Callback | keras.callbacks.Callback):
        callbacks = [callbacks]  # one callback, as Lightning takes it
    elif callbacks is not None and not isinstance(callbacks, list | tuple):
        raise ValueError(f"callbacks must be a callback or a list of callbacks; got {type(callbacks).__name__}.")
    given = []
    for each in callbacks or []:
        if isinstance(each, keras.callbacks.Callback):
            each = wrap_keras_callback(each)
        elif not isinstance(each, Callback):
            raise ValueError(f"callbacks must be ktrainer or Keras callbacks (kt.callbacks.Callback, "
                             f"keras.callbacks.Callback); got {type(each).__name__}.")
        given.append(each)
    return given


def _missing_monitors(given: list[Callback]) -> list[Callback]:
    """A LearningRateMonitor and a ThroughputMonitor, each unless `given` holds one (a run with a logger gets both)."""
    return [monitor() for monitor in (LearningRateMonitor, ThroughputMonitor)
            if not any(isinstance(c, monitor) for c in given)]
