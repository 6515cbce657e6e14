"""A tensor file that loads without executing code and without copies: a JSON index, then raw bytes.

Layout: 8 bytes (little-endian uint64) giving the index length, the JSON index
`{name: {"dtype": "float32", "shape": [...], "offset": ..., "nbytes": ...}}` (offsets from the
end of the index; dtypes by name, so bfloat16 and the float8 types round-trip), then each
array's bytes, little-endian, C order. Writing streams each array's own buffer; reading returns
numpy views of the bytes read. (The same idea as safetensors, with no extra dependency.)
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np

from ktrainer.checkpoint.checksum import ALGORITHM, Checksum

__all__ = ["TensorFile", "read_tensors", "parse_index", "index_length", "dtype_from_name", "nbytes_of"]

_LENGTH = struct.Struct("<Q")


def dtype_from_name(name: str) -> np.dtype:
    """A numpy dtype from its name, including the ml_dtypes ones (bfloat16, float8_*).

    Raises:
        ValueError: For a name that is no dtype.
    """
    try:
        return np.dtype(name)
    except TypeError:
        pass
    extra = getattr(ml_dtypes, name, None) if name.isidentifier() and not name.startswith("_") else None
    try:
        if extra is not None:
            return np.dtype(extra)
    except TypeError:
        pass
    raise ValueError(f"unknown dtype {name!r} in a tensor file")


def _dtype_of(value: Any) -> np.dtype:
    dtype = getattr(value, "dtype", None)
    name = getattr(dtype, "name", dtype)
    return dtype_from_name(str(name))


def nbytes_of(value: Any) -> int:
    """Bytes of an array-like (numpy array or variable) without reading it."""
    return int(np.prod(value.shape, dtype=np.int64)) * _dtype_of(value).itemsize


class TensorFile:
    """The content of one tensor file, made only when it is written.

    Args:
        arrays: name -> numpy array, or anything with `shape` and `dtype` that `read` turns into
            one (a live variable: it is read when the file is written, one at a time).
        read: Turns a value into a numpy array; default `np.asarray`.
        slices: Array name -> which slice of a sharded variable it is, as the manifest records it (snapshot.py).
            `slices` lists these entries, each with its place in the file added (`{"offset", "nbytes"}` from the
            file's start) and, once the file is written, its own checksum: a restore reads and checks one slice
            by its byte range alone.
    """

    def __init__(self, arrays: dict[str, Any], read: Callable[[Any], np.ndarray] | None = None,
                 slices: dict[str, list] | None = None) -> None:
        self.arrays = arrays
        self._read = read or np.asarray
        self._index, offset = {}, 0
        for name, value in arrays.items():
            dtype = _dtype_of(value)
            nbytes = nbytes_of(value)
            self._index[name] = {"dtype": dtype.name, "shape": [int(d) for d in value.shape], "offset": offset,
                                 "nbytes": nbytes}
            offset += nbytes
        self._header = json.dumps(self._index).encode()
        self.nbytes = _LENGTH.size + len(self._header) + offset
        start = _LENGTH.size + len(self._header)
        self._located = {name: {"offset": start + self._index[name]["offset"], "nbytes": self._index[name]["nbytes"]}
                         for name in slices or {}}
        self.slices = [[*entry, self._located[name]] for name, entry in (slices or {}).items()]

    def chunks(self) -> Iterator[Any]:
        """The file's bytes as a sequence of buffers (the header, then each array's own memory)."""
        yield _LENGTH.pack(len(self._header)) + self._header
        for name, value in self.arrays.items():
            entry = self._index[name]
            dtype = dtype_from_name(entry["dtype"]).newbyteorder("<")
            array = np.ascontiguousarray(self._read(value))
            if array.dtype != dtype:
                array = array.astype(dtype)
            if array.nbytes != entry["nbytes"]:
                raise ValueError(f"{name!r} changed size while being written")
            view = memoryview(array.reshape(-1).view(np.uint8))  # as bytes: also for dtypes buffers refuse
            if name in self._located:
                self._located[name][ALGORITHM] = Checksum.of(view)
            if array.nbytes:
                yield view


def read_tensors(data: Any) -> dict[str, np.ndarray]:
    """Read what `TensorFile` wrote (read-only views into `data`); arrays already read into their own buffers
    (`tensor_read.LoadedTensors`) are returned as they are.

    Raises:
        ValueError: When the data is not such a file or is truncated.
    """
    if isinstance(data, dict):
        return data
    start, entries = parse_index(data)
    arrays = {}
    for name, (dtype, shape, offset, nbytes) in entries.items():
        if start + offset + nbytes > len(data):
            raise ValueError(f"tensor file truncated in {name!r}")
        flat = np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize, offset=start + offset)
        arrays[name] = flat.reshape(shape)
    return arrays


def index_length(head: Any) -> int:
    """Bytes of the file before its arrays (the length field and the index), from its first 8 bytes.

    Raises:
        ValueError: When there are fewer than 8 bytes.
    """
    if len(head) < _LENGTH.size:
        raise ValueError("tensor file too short")
    return _LENGTH.size + _LENGTH.unpack_from(head)[0]


def parse_index(data: Any) -> tuple[int, dict[str, tuple[np.dtype, list[int], int, int]]]:
    """(where the arrays start, {name: (dtype, shape, offset from that start, nbytes)}) of a tensor file's
    first bytes (at least up to the end of its index), every entry checked.

    Raises:
        ValueError: When the data is not such a file, or is truncated in its index.
    """
    start = index_length(data)
    if start > len(data):
        raise ValueError("tensor file truncated in its index")
    try:
        index = json.loads(bytes(data[_LENGTH.size:start]))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError("tensor file index is not valid JSON") from None
    if not isinstance(index, dict):
        raise ValueError("tensor file index is not an object of entries")
    return start, {name: _checked_entry(name, entry) for name, entry in index.items()}


def _checked_entry(name: str, entry: Any) -> tuple[np.dtype, list[int], int, int]:
    """(dtype, shape, offset, nbytes) of an index entry, each checked; ValueError otherwise."""
    if not isinstance(entry, dict):
        raise ValueError(f"tensor file index entry {name!r} is not an object")
    try:
        dtype = dtype_from_name(str(entry["dtype"])).newbyteorder("<")
    except (KeyError, TypeError):
        raise ValueError(f"tensor file index entry {name!r} has no usable dtype") from None
    if dtype.itemsize == 0 or dtype.hasobject:  # no fixed-size numbers: nothing a checkpoint writes
        raise ValueError(f"tensor file index entry {name!r} has dtype {entry['dtype']!r}, which holds no numbers")
    shape, offset, nbytes = entry.get("shape"), entry.get("offset"), entry.get("nbytes")
    counts = shape if isinstance(shape, list) else []
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in counts):
        raise ValueError(f"tensor file index entry {name!r} has a bad shape {shape!r}")
    for label, value in (("offset", offset), ("nbytes", nbytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"tensor file index entry {name!r} has a bad {label} {value!r}")
    if nbytes != math.prod(shape) * dtype.itemsize:  # Python ints: a crafted shape cannot overflow
        raise ValueError(f"tensor file index entry {name!r} declares {nbytes} bytes for shape {shape} of {dtype}")
    return dtype, shape, offset, nbytes
