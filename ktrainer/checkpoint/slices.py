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

Slices live in files of their own (`model-00000-p00001...`), and the manifest records each one's byte range
and checksum there, so a restore never reads such a file whole: each slice is a `StoredSlice`, read by
its byte range and checked against its own checksum only when a region overlapping it is asked for.

Everything here is duck-typed on `sharding`, `addressable_shards` and `devices_indices_map`, so the
checkpoint code imports no framework.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ktrainer.checkpoint.checksum import ALGORITHM, Checksum
from ktrainer.checkpoint.format import is_slice_file
from ktrainer.checkpoint.io import CheckpointError
from ktrainer.checkpoint.workers import io_workers

__all__ = ["Sliced", "SavedSlices", "StoredSlice", "sliced_of", "ranged_files", "SLICED", "Region"]

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


def _overlaps(one: Region, other: Region) -> bool:
    """True when two regions share a value."""
    return all(max(a, c) < min(b, d) for (a, b), (c, d) in zip(one, other, strict=True))


def _region(index: Sequence[slice], shape: tuple[int, ...]) -> Region:
    """A shard's index (slices, `slice(None)` for a whole dimension) as [start, stop) per dimension."""
    return tuple((part.start or 0, size if part.stop is None else part.stop)
                 for part, size in zip(index, shape, strict=True))


def ranged_files(fields: dict[str, Any]) -> dict[str, list]:
    """The files of a manifest (its `fields`) that a restore reads slice by slice: files of slices only, each
    slice listed in the `slices` field with its byte range and checksum. {file name: its entries}."""
    listed = fields.get("slices")
    if not isinstance(listed, dict):
        return {}
    return {name: entries for name, entries in listed.items()
            if is_slice_file(name) and isinstance(entries, list) and all(map(_located, entries))}


def _located(entry: Any) -> bool:
    """True for a manifest slice entry [tensor, shape, dtype, region, {offset, nbytes, crc32c}]."""
    where = entry[4] if isinstance(entry, list) and len(entry) == 5 and isinstance(entry[4], dict) else {}
    counts = [where.get("offset"), where.get("nbytes")]
    return all(isinstance(count, int) and not isinstance(count, bool) for count in counts) \
        and isinstance(where.get(ALGORITHM), str)


class StoredSlice:
    """One slice in a checkpoint file, read (by its byte range) and checked only when `load` is called.

    Args:
        file: The file (`fsspec_io.RangedFile`: `read(offset, nbytes)` and `url`).
        name: The tensor's section + key, for messages.
        shape: The slice's shape.
        dtype: Its dtype.
        where: Its manifest entry's place: {"offset", "nbytes", "crc32c"}.

    Raises:
        CheckpointError: When its byte count does not fit its shape and dtype.
    """

    def __init__(self, file: Any, name: str, shape: tuple[int, ...], dtype: np.dtype, where: dict[str, Any]) -> None:
        self.file, self.name, self.shape, self.dtype = file, name, tuple(shape), np.dtype(dtype).newbyteorder("<")
        self.offset, self.nbytes, self.checksum = where["offset"], where["nbytes"], where[ALGORITHM]
        if self.nbytes != math.prod(self.shape) * self.dtype.itemsize:
            raise CheckpointError(f"{file.url}: slice {name} is listed with {self.nbytes} bytes for shape {self.shape} "
                                  f"of {self.dtype} (the manifest's slices field is damaged).")

    def load(self) -> np.ndarray:
        """Its values (read-only), read now.

        Raises:
            CheckpointError: When they cannot be read or do not match the checksum (corrupt).
        """
        data = self.file.read(self.offset, self.nbytes)
        if Checksum.of(data) != self.checksum:
            raise CheckpointError(f"{self.file.url}: slice {self.name} does not match its {ALGORITHM} checksum "
                                  "(corrupt); nothing after it was loaded. Resume from an earlier checkpoint "
                                  "(`ktrainer ckpt ls` lists them).")
        return np.frombuffer(data, dtype=self.dtype).reshape(self.shape)


class SavedSlices:
    """A sharded variable read from a checkpoint: any region of it, from the slices that overlap it.

    Args:
        shape: The whole variable's shape.
        dtype: Its dtype.
        parts: (region, values) of every slice saved: an array, or a `StoredSlice` read when it is needed.

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
        self._loaded: dict[int, np.ndarray] | None = None

    @contextmanager
    def kept(self, regions: Sequence[Sequence[slice]] = ()) -> Iterator[SavedSlices]:
        """Within it, each stored slice read is kept, so regions that overlap the same slice read it once (a
        variable placed on several devices); they are dropped at its end.

        Args:
            regions: The regions that will be asked for (a slice per dimension each): the stored slices they
                overlap are read now, in parallel.
        """
        wanted = [_region(index, self.shape) for index in regions]
        needed = [number for number, (region, values) in enumerate(self.parts)
                  if isinstance(values, StoredSlice) and any(_overlaps(region, other) for other in wanted)]
        self._loaded = dict(zip(needed, io_workers().map(lambda number: self.parts[number][1].load(), needed),
                                strict=True))
        try:
            yield self
        finally:
            self._loaded = None

    def _values(self, number: int) -> np.ndarray:
        values = self.parts[number][1]
        if not isinstance(values, StoredSlice):
            return values
        if self._loaded is None:
            return values.load()
        if number not in self._loaded:
            self._loaded[number] = values.load()
        return self._loaded[number]

    @property
    def ndim(self) -> int:
        """Dimensions of the whole variable."""
        return len(self.shape)

    def region(self, index: Sequence[slice] | None = None) -> np.ndarray:
        """The values of one region (`index`: a slice per dimension, as JAX gives a device's; None: all): a
        read-only view of a saved slice when the region is one, else a new array put together."""
        wanted = _region(index, self.shape) if index is not None else tuple((0, size) for size in self.shape)
        for number, (region, _) in enumerate(self.parts):
            if region == wanted:  # the same layout as saved: the slice itself, no copy
                return self._values(number)
        out = np.empty(tuple(stop - start for start, stop in wanted), self.dtype)
        for number, (region, _) in enumerate(self.parts):
            if not _overlaps(region, wanted):
                continue  # not read at all: a slice this region does not touch
            overlap = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(region, wanted, strict=True))
            source = tuple(slice(s - r[0], e - r[0]) for (s, e), r in zip(overlap, region, strict=True))
            target = tuple(slice(s - w[0], e - w[0]) for (s, e), w in zip(overlap, wanted, strict=True))
            out[target] = self._values(number)[source]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.region()
        return whole if dtype is None else whole.astype(dtype)
