"""JAX: the next call's batches, read and placed on the devices while the device runs the current call.

A jitted call returns at once and the device works on; reading its outputs waits for it. The training
runner reads the next call's batches before it waits, so the host's share of a call (the data
iterator, gathering shuffled rows, stacking N batches for a scan, the copy to the device) overlaps the
device's work instead of leaving the device idle between calls.

Reading ahead changes when batches are read, never which batch a step trains on, nor where a failure
surfaces:
- batches read ahead are the next ones taken from the same iterator (an epoch's, or a stream's single
  reader across epochs); a call on another iterator drops them, since the epoch they belong to is over
  (the data position in checkpoints counts trained batches, not read ones);
- a call that takes fewer batches than were read ahead leaves the rest to the next call;
- an error the iterator raises while reading ahead is raised when the batch it stood for is taken,
  at the same step as without reading ahead; batches that fail to be prepared ahead (no room on the
  device beside the current call's) are prepared again when they are taken, and fail there.

The caller says how many batches the next call may take (the Schedule knows: none after an epoch's
last call or at `max_steps`), so nothing is read that no step will train on, unless a callback or
a signal stops the run early.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ReadAhead"]


class ReadAhead:
    """Batches read from an iterator before they are due, with the form the call takes them in.

    Args:
        prepare: Turns a list of host batches into what the call takes (stacked, placed on the devices).
    """

    def __init__(self, prepare: Callable[[list[Any]], Any]) -> None:
        self._prepare = prepare
        self._iterator: Iterator[Any] | None = None
        self._batches: list[Any] = []
        self._prepared: Any = None  # `prepare(self._batches)`, while it still stands for exactly them
        self._error: Exception | None = None  # what the iterator raised after `self._batches`

    def take(self, iterator: Iterator[Any], count: int) -> tuple[list[Any], Any]:
        """The next `count` batches of `iterator` (fewer where it ends) and their prepared form (None without batches).

        Raises:
            Exception: What the iterator raised, when the batch it stood for is among these.
        """
        self._follow(iterator)
        batches, prepared = self._batches, self._prepared
        self._batches, self._prepared = batches[count:], None
        if len(batches) > count:
            batches, prepared = batches[:count], None
        elif len(batches) < count:
            more = self._read(iterator, count - len(batches))
            if more:
                batches, prepared = batches + more, None
        if not batches:
            return [], None
        return batches, self._prepare(batches) if prepared is None else prepared

    def read(self, iterator: Iterator[Any], count: int) -> None:
        """Read up to `count` batches ahead (counting those already held) and prepare them; an error of the
        iterator is held for the `take` it belongs to."""
        self._follow(iterator)
        held = len(self._batches)
        if self._error is None and held < count:
            try:
                for _ in range(count - held):
                    self._batches.append(next(iterator))
            except StopIteration:
                pass
            except Exception as error:  # raised again by the `take` that reaches it
                self._error = error
        if self._batches and (self._prepared is None or len(self._batches) > held):
            try:
                self._prepared = self._prepare(self._batches)
            except Exception:  # noqa: BLE001 - prepared again by the `take` they are due in, which raises it there
                self._prepared = None

    def _follow(self, iterator: Iterator[Any]) -> None:
        if iterator is not self._iterator:
            self._iterator, self._batches, self._prepared, self._error = iterator, [], None, None

    def _read(self, iterator: Iterator[Any], count: int) -> list[Any]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return list(itertools.islice(iterator, count))
