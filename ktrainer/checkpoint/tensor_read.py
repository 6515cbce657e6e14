"""A tensor file read from a stream straight into one aligned buffer per array, every byte checksummed in order.

A restore reads each array into memory of its own, 64-byte aligned, that nothing else refers to: a
resume hands it to the variables, which on a CPU use it in place (`Engine.host_value`), and no array
keeps a whole file's bytes alive.
"""

from __future__ import annotations

import mmap
from typing import BinaryIO

import numpy as np

from ktrainer.checkpoint.checksum import Checksum
from ktrainer.checkpoint.tensors import index_length, parse_index

__all__ = ["ALIGNMENT", "LoadedTensors", "read_into_buffers"]

ALIGNMENT = 64  # what XLA's CPU client needs to use host memory in place
_PIECE = 1 << 18  # read, then checksummed while it is still in the CPU cache
_MAPPED = 1 << 20  # arrays of this size and more get a mapping of their own
_PRIVATE = getattr(mmap, "MAP_PRIVATE", None)  # not on Windows: numpy's memory there


class LoadedTensors(dict):
    """A tensor file's arrays (name -> array), each in its own buffer, read and checksummed."""


def read_into_buffers(stream: BinaryIO, size: int, checksum: Checksum) -> LoadedTensors | bytes:
    """Read a tensor file of `size` bytes from `stream`, adding all its bytes to `checksum` in order.

    Returns:
        Its arrays, each in its own aligned buffer; or the file's bytes when its index does not lay the arrays
        out one after another within the file (a damaged file: `read_tensors` then says what is wrong).

    Raises:
        EOFError: When the stream ends before `size` bytes.
    """
    head = _read_exactly(stream, min(size, 8))
    try:
        prefix = min(size, max(index_length(head), len(head)))
    except ValueError:
        prefix = len(head)
    head += _read_exactly(stream, prefix - len(head))
    try:
        start, entries = parse_index(head)
    except ValueError:
        entries = None
    layout = _in_order(start, entries, size) if entries is not None else None
    if layout is None:
        data = head + _read_exactly(stream, size - len(head))
        checksum.update(data)
        return data
    checksum.update(head)
    arrays, position = LoadedTensors(), len(head)
    for name, (dtype, shape, offset, nbytes) in layout:
        checksum.update(_read_exactly(stream, start + offset - position))
        flat = _aligned(nbytes)
        _read_checked(stream, flat, checksum, name)
        arrays[name] = flat.view(dtype).reshape(shape)
        position = start + offset + nbytes
    checksum.update(_read_exactly(stream, size - position))
    return arrays


def _in_order(start: int, entries: dict[str, tuple], size: int) -> list[tuple[str, tuple]] | None:
    """The entries by offset when each array lies after the previous one and inside the file; else None."""
    layout = sorted(entries.items(), key=lambda item: item[1][2])
    end = start
    for _, (_, _, offset, nbytes) in layout:
        if start + offset < end:
            return None
        end = start + offset + nbytes
    return layout if end <= size else None


def _read_checked(stream: BinaryIO, flat: np.ndarray, checksum: Checksum, name: str) -> None:
    """Fill `flat` from the stream piece by piece, each piece checksummed while it is still in the CPU's cache
    (30% less time than a checksum of the whole array after it is read)."""
    view, start = memoryview(flat), 0
    while start < len(flat):
        got = stream.readinto(view[start:start + _PIECE])
        if not got:
            raise EOFError(f"the stream ended in {name!r}")
        checksum.update(flat[start:start + got])
        start += got


def _aligned(nbytes: int) -> np.ndarray:
    """`nbytes` bytes of fresh memory starting on an `ALIGNMENT` boundary (not written: the read fills it).

    A large array gets a private mapping of its own: numpy asks the kernel for huge pages for large arrays,
    and a process that has already churned through memory then stalls while the kernel compacts it (a fresh
    process's first 100 MB restore took 78-118 ms in numpy's memory, 50-58 ms in mappings: the plain read's
    time). A mapping is page-aligned and goes back to the system when the last array using it is freed.
    """
    if nbytes >= _MAPPED and _PRIVATE is not None:
        raw = np.frombuffer(mmap.mmap(-1, nbytes, flags=_PRIVATE), np.uint8)
        skip = 0
    else:
        raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        skip = -raw.ctypes.data % ALIGNMENT
    return raw[skip:skip + nbytes]


def _read_exactly(stream: BinaryIO, nbytes: int) -> bytes:
    data = stream.read(nbytes) if nbytes > 0 else b""
    if len(data) != nbytes:
        raise EOFError(f"the stream ended {nbytes - len(data)} bytes early")
    return data
