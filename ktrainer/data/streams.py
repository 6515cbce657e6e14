"""A one-shot iterator of batches (a generator object) read as one stream across epochs, as Keras's `fit` reads it.

A generator can be read only once, so what the Trainer looks at before training (the first batch's
shapes, a dataset's signature) must not be lost to training: `look_ahead` keeps every batch it reads
for the next reader. Each epoch takes the next batches of the same stream (`limit_train_batches`
says how many, as `steps_per_epoch` does in Keras); a stream that ends, ends the epochs.
"""

from __future__ import annotations

import types
from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = ["Stream", "is_one_shot"]


def is_one_shot(data: Any) -> bool:
    """True for an iterator that can be read only once: a generator object, or a built-in iterator (`iter(list)`,
    `map`, `zip`, itertools). An iterator class of the user's own is read anew through `iter()` each epoch, as
    before: its `__iter__` may start a new pass. Nothing is called to decide."""
    if isinstance(data, types.GeneratorType):
        return True
    iterate = getattr(type(data), "__iter__", None)
    return hasattr(data, "__next__") and iterate is not None and not isinstance(iterate, types.FunctionType)


class Stream:
    """The batches of a one-shot iterator, in order, none lost to looking ahead.

    Args:
        iterator: The user's iterator of batches.
    """

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator
        self._kept: deque[Any] = deque()

    def __iter__(self) -> Iterator[Any]:
        """The stream from where the last reader stopped: the batches looked at first, then new ones."""
        while True:
            if self._kept:
                yield self._kept.popleft()
                continue
            try:
                batch = next(self._iterator)
            except StopIteration:
                return
            yield batch

    def look_ahead(self) -> Iterator[Any]:
        """The stream from where the last reader stopped, without consuming it: what this reads, the next
        `__iter__` yields again."""
        yield from list(self._kept)
        for batch in self._iterator:
            self._kept.append(batch)
            yield batch
