"""A one-shot iterator of batches (a generator object) read as one stream across epochs, as Keras's `fit` reads it.

A generator can be read only once, so what the Trainer looks at before training (the first batch's
shapes, a dataset's signature) must not be lost to training: `look_ahead` keeps every batch it reads
for the next reader. Each epoch takes the next batches of the same stream (`limit_train_batches`
says how many, as `steps_per_epoch` does in Keras); a stream that ends, ends the epochs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = ["Stream", "is_one_shot"]


def is_one_shot(data: Any) -> bool:
    """True for an iterator (iterating it again continues it), e.g. a generator object or `iter(list)`."""
    try:
        return iter(data) is data
    except TypeError:
        return False


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
        while True:
            try:
                batch = next(self._iterator)
            except StopIteration:
                return
            self._kept.append(batch)
            yield batch
