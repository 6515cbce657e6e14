"""The Trainer's `devices` argument as device indices, checked the same way on every backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["requested_indices"]


def requested_indices(devices: Any) -> list[int] | None:
    """`devices` as a list of device indices: an int N is 0..N-1, a list is itself; "auto" gives None.

    Raises:
        ValueError: For a count below 1, a list that is empty, holds anything but indices >= 0 or
            repeats one, or any other value.
    """
    if isinstance(devices, str) and devices == "auto":
        return None
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        indices = list(devices)
        if not indices or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
            raise ValueError(f"devices={devices!r}: a list of devices must hold indices >= 0, e.g. [0, 1].")
        if len(set(indices)) != len(indices):
            raise ValueError(f"devices={devices!r} repeats an index; list each device once.")
        return indices
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices < 1:
            raise ValueError(f"devices={devices} must be >= 1 (or 'auto', or a list of indices).")
        return list(range(devices))
    raise ValueError(f"devices must be 'auto', an int >= 1 or a list of indices, got {devices!r}.")
