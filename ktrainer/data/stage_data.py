"""Which data a fit/validate/test/predict call runs on: what was passed, else the module's hook; shuffling; the
validation split."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ktrainer.data.sources import BatchSource, split_for_validation

__all__ = ["choose_source", "split_training_data", "shuffle_setting"]

_CALLS = {"train_data": "trainer.fit(module, train_data=...)", "val_data": "trainer.validate(module, data)",
          "test_data": "trainer.test(module, data)", "predict_data": "trainer.predict(module, data)"}

log = logging.getLogger("ktrainer")


def choose_source(given: Any, hook: Callable[[], Any], what: str, *, global_batch_size: int, training: bool,
                  required: bool, shuffle: bool = False, drop_remainder: bool = False,
                  limit_batches: int | float | None = None) -> BatchSource | None:
    """The data passed to the call, else what the module's hook returns, as a BatchSource of global batches.

    Args:
        given: The data passed to fit/validate/test/predict, or None.
        hook: The module's data hook (`train_data`, `val_data`, ...), asked when nothing was given.
        what: The data's name in messages, the module's hook ("train_data", "val_data", "predict_data").
        global_batch_size: Examples per step across all replicas.
        training: Whether it is training data (shuffled each epoch; an epoch must end).
        required: Whether no data is an error (else None is returned).
        shuffle: Shuffle training data each epoch.
        drop_remainder: Drop a last partial batch (several replicas need equal shares).
        limit_batches: `limit_train_batches`: an int lets data that repeats forever have epochs.

    Raises:
        ValueError: When required data is missing, or training data repeats forever with no batch limit.
    """
    data = given if given is not None else hook()
    if data is None:
        if required:
            raise ValueError(f"No {what}: pass it to the Trainer call ({_CALLS.get(what, 'as its data argument')}) "
                             f"or return it from the module's {what}() hook.")
        return None
    source = BatchSource(data, global_batch_size, shuffle=training and shuffle, what=what,
                         drop_remainder=training and drop_remainder)
    if training and source.is_infinite and not isinstance(limit_batches, int):
        raise ValueError(f"{what} repeats forever, so an epoch never ends. Set limit_train_batches=N "
                         "(batches per epoch) on the Trainer.")
    return source


def split_training_data(module: Any, train_data: Any, fraction: float) -> tuple[Any, Any]:
    """`validation_split`: the given (or the module's) training data, split into (train, validation).

    Raises:
        ValueError: When the module also gives validation data (two sources would be a surprise),
            or there is no training data to split.
    """
    if module.val_data() is not None:
        raise ValueError(f"validation_split={fraction} and {type(module).__name__}.val_data() both give "
                         "validation data. Use one: drop validation_split, or return None from val_data().")
    data = train_data if train_data is not None else module.train_data()
    if data is None:
        raise ValueError(f"validation_split={fraction} has no training data to split: pass "
                         "trainer.fit(module, train_data=...) or return it from the module's train_data().")
    return split_for_validation(data, fraction)


def shuffle_setting(given: bool | None, saved: bool | None) -> bool:
    """`fit(shuffle=...)`: as given; else as the checkpoint resumed from was trained (`saved`); else True."""
    if given is not None and saved is not None and given != saved:
        log.warning("Resuming a run trained with shuffle=%s under shuffle=%s: the data order differs from the "
                    "interrupted run's.", saved, given)
    if given is not None:
        return given
    return True if saved is None else bool(saved)
