"""Sharded variables in a checkpoint: each stored as the slices the devices hold, and read back onto any layout.

A variable split over a device mesh (a JAX array whose sharding is not fully replicated) is never gathered
to save it. Its distinct slices are found from its sharding (the same list in every process); each is
owned by the first device, in device order, that holds it, and written by that device's process, so a
slice replicated over several devices is written once. The state file keeps a reference to all of them:

    {"__sliced__": {"shape": [64, 32], "dtype": "float32",
                    "parts": [["model", "/00000:emb/embeddings@0", [[0, 8], [0, 32]]], ...]}}

(each part: the section and key of its tensor, and the [start, stop) of each dimension it covers). Read
back, a reference becomes `SavedSlices`, which gives any region of the whole array from the parts that
overlap it: a run on another mesh asks for the regions its own devices hold, and an unsharded run (one
device, TensorFlow) for the whole array.

Everything here is duck-typed on `sharding`, `addressable_shards` and `devices_indices_map`, so the
checkpoint code imports no framework.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Sliced", "SavedSlices", "sliced_of", "SLICED", "Region"]

SLICED = "__sliced__"
Region = tuple[tuple[int, int], ...]  # [start, stop) per dimension


@dataclass
class Sliced:
    """A sharded variable as a checkpoint stores it.

    Attributes:
        shape: The whole variable's shape.
        dtype: Its dtype's name.
        regions: Every distinct slice, in owner order (the same list in every process).
        parts: The slices this process writes: region -> its values (an array-like a save reads).
    """

    shape: tuple[int, ...]
    dtype: str
    regions: list[Region]
    parts: dict[Region, Any] = field(default_factory=dict)

    def frozen(self, snapshot: Callable[[Any], np.ndarray]) -> Sliced:
        """The same slices, each read to the host now (a background save's snapshot)."""
        return Sliced(self.shape, self.dtype, self.regions, {r: snapshot(v) for r, v in self.parts.items()})


def sliced_of(value: Any) -> Sliced | None:
    """`value` (a variable or array) as `Sliced` when it is split over devices; None when every device holds it
    all (it is saved whole) or it is no device array."""
    if isinstance(value, Sliced):
        return value
    array = getattr(value, "value", value)
    sharding = getattr(array, "sharding", None)
    if sharding is None or getattr(sharding, "is_fully_replicated", True) or not hasattr(array, "addressable_shards"):
        return None
    shape = tuple(int(d) for d in array.shape)
    owners: dict[Region, Any] = {}
    for device, index in sorted(sharding.devices_indices_map(shape).items(), key=lambda item: item[0].id):
        owners.setdefault(_region(index, shape), device)
    mine = {shard.device: shard for shard in array.addressable_shards}
    parts = {region: mine[owner].data for region, owner in owners.items() if owner in mine}
    return Sliced(shape, np.dtype(getattr(array.dtype, "name", array.dtype)).name, list(owners), parts)


def _region(index: Sequence[slice], shape: tuple[int, ...]) -> Region:
    """A shard's index (slices, `slice(None)` for a whole dimension) as [start, stop) per dimension."""
    return tuple((part.start or 0, size if part.stop is None else part.stop)
                 for part, size in zip(index, shape, strict=True))


class SavedSlices:
    """A sharded variable read from a checkpoint: any region of it, from the slices that overlap it.

    Args:
        shape: The whole variable's shape.
        dtype: Its dtype.
        parts: (region, values) of every slice saved.

    Raises:
        ValueError: When the slices do not cover the whole variable exactly once, or one's values do not
            have its region's shape.
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, parts: list[tuple[Region, np.ndarray]]) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.parts = parts
        covered = 0
        for region, values in parts:
            extent = tuple(stop - start for start, stop in region)
            if len(region) != len(self.shape) or tuple(values.shape) != extent \
                    or any(start < 0 or stop > size for (start, stop), size in zip(region, self.shape, strict=True)):
                raise ValueError(f"a saved slice {region} of shape {tuple(values.shape)} does not fit a variable of "
                                 f"shape {self.shape}")
            covered += math.prod(extent)
        if covered != math.prod(self.shape):
            raise ValueError(f"the saved slices cover {covered} of the {math.prod(self.shape)} values of a variable "
                             f"of shape {self.shape}")

    @property
    def ndim(self) -> int:
        """Dimensions of the whole variable."""
        return len(self.shape)

    def region(self, index: Sequence[slice] | None = None) -> np.ndarray:
        """The values of one region (`index`: a slice per dimension, as JAX gives a device's; None: all): a
        read-only view of a saved slice when the region is one, else a new array put together."""
        wanted = _region(index, self.shape) if index is not None else tuple((0, size) for size in self.shape)
        for region, values in self.parts:
            if region == wanted:  # the same layout as saved: the slice itself, no copy
                return values
        out = np.empty(tuple(stop - start for start, stop in wanted), self.dtype)
        for region, values in self.parts:
            overlap = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(region, wanted, strict=True))
            if any(start >= stop for start, stop in overlap):
                continue
            source = tuple(slice(s - r[0], e - r[0]) for (s, e), r in zip(overlap, region, strict=True))
            target = tuple(slice(s - w[0], e - w[0]) for (s, e), w in zip(overlap, wanted, strict=True))
            out[target] = values[source]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.region()
        return whole if dtype is None else whole.astype(dtype)
