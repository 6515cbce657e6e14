"""JAX: how many bytes of a state each device holds, read from the arrays' shardings (not from a formula)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = ["bytes_per_device", "replicated_bytes", "most_loaded"]


def bytes_per_device(arrays: Iterable[Any]) -> dict[Any, int]:
    """Bytes of `arrays` (JAX arrays or Keras variables) on each of this process's devices: the shards it holds."""
    held: dict[Any, int] = defaultdict(int)
    for each in arrays:
        array = getattr(each, "value", each)
        for shard in array.addressable_shards:
            held[shard.device] += int(shard.data.nbytes)
    return dict(held)


def replicated_bytes(arrays: Iterable[Any]) -> int:
    """Bytes every device would hold with each array replicated (its whole size)."""
    return sum(int(getattr(each, "value", each).nbytes) for each in arrays)


def most_loaded(arrays: Iterable[Any]) -> int:
    """The bytes of the device of this process that holds the most of `arrays` (0 for none)."""
    return max(bytes_per_device(arrays).values(), default=0)
