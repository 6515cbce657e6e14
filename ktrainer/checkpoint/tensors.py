"""A tensor file that loads without executing code and without copies: a JSON index, then raw bytes.

Layout: 8 bytes (little-endian uint64) giving the index length, the JSON index
`{name: {"dtype": ..., "shape": [...], "offset": ..., "nbytes": ...}}` (offsets from the end of
the index), then each array's bytes, C order. Writing streams each array's own buffer; reading
returns numpy views of the bytes read. (The same idea as safetensors, with no extra dependency.)
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

import numpy as np

__all__ = ["write_tensors", "read_tensors"]

_LENGTH = struct.Struct("<Q")


def write_tensors(stream: BinaryIO, arrays: dict[str, Any]) -> None:
    """Write `arrays` to `stream` (any object with `write`).

    Values are numpy arrays, or anything with `shape`, `dtype` and `__array__` (a Keras variable):
    those are read one at a time while writing, so the file never needs a copy of all of them.
    """
    index, offset = {}, 0
    for name, value in arrays.items():
        dtype = np.dtype(getattr(value.dtype, "name", value.dtype))
        nbytes = int(np.prod(value.shape, dtype=np.int64)) * dtype.itemsize
        index[name] = {"dtype": dtype.str, "shape": [int(d) for d in value.shape], "offset": offset,
                       "nbytes": nbytes}
        offset += nbytes
    header = json.dumps(index).encode()
    stream.write(_LENGTH.pack(len(header)))
    stream.write(header)
    for name, value in arrays.items():
        array = np.require(np.asarray(value), dtype=np.dtype(index[name]["dtype"]), requirements="C")
        if array.nbytes != index[name]["nbytes"]:
            raise ValueError(f"{name!r} changed size while being written")
        if array.nbytes:
            stream.write(memoryview(array.reshape(-1)).cast("B"))


def read_tensors(data: bytes) -> dict[str, np.ndarray]:
    """Read what `write_tensors` wrote (read-only views into `data`).

    Raises:
        ValueError: When the data is not such a file or is truncated.
    """
    if len(data) < _LENGTH.size:
        raise ValueError("tensor file too short")
    (length,) = _LENGTH.unpack_from(data)
    start = _LENGTH.size + length
    index = json.loads(bytes(data[_LENGTH.size:start]))
    arrays = {}
    for name, entry in index.items():
        end = start + entry["offset"] + entry["nbytes"]
        if end > len(data):
            raise ValueError(f"tensor file truncated in {name!r}")
        flat = np.frombuffer(data, dtype=np.dtype(entry["dtype"]), count=entry["nbytes"] // np.dtype(
            entry["dtype"]).itemsize, offset=start + entry["offset"])
        arrays[name] = flat.reshape(entry["shape"])
    return arrays
