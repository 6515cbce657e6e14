"""A restore's read of a tensor file: each array in its own aligned buffer, every byte checksummed, the same arrays
as a read of the file's bytes; a damaged layout comes back as bytes, for the usual checks to refuse."""

from __future__ import annotations

import io
import json
import struct

import ml_dtypes
import numpy as np
import pytest

from ktrainer.checkpoint.checksum import Checksum
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError
from ktrainer.checkpoint.tensor_read import ALIGNMENT, LoadedTensors, read_into_buffers
from ktrainer.checkpoint.tensors import TensorFile, read_tensors
from ktrainer.utils.fs import Location

ARRAYS = {"/kernel": np.arange(12, dtype=np.float32).reshape(3, 4), "/bias": np.array([1.5, -2.0], np.float64),
          "/half": np.array([[0.5, 3.0]], ml_dtypes.bfloat16), "/empty": np.zeros((0, 3), np.float32),
          "/iterations": np.array(7, np.int64),
          "/large": np.arange(300_000, dtype=np.float32)}  # over 1 MiB: a mapping of its own


def file_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    return b"".join(bytes(chunk) for chunk in TensorFile(arrays).chunks())


def read(data: bytes) -> tuple[LoadedTensors | bytes, str]:
    checksum = Checksum()
    loaded = read_into_buffers(io.BytesIO(data), len(data), checksum)
    return loaded, checksum.hexdigest()


def test_each_array_comes_back_in_its_own_aligned_buffer_equal_to_a_read_of_the_bytes():
    data = file_bytes(ARRAYS)
    loaded, digest = read(data)
    assert isinstance(loaded, LoadedTensors)
    assert digest == Checksum.of(data)  # every byte of the file, in order
    expected = read_tensors(data)
    assert list(loaded) == list(expected)
    for name, array in loaded.items():
        assert array.dtype == expected[name].dtype and array.shape == expected[name].shape
        np.testing.assert_array_equal(array, expected[name])
        assert array.flags.writeable and array.base is not None  # its own buffer, which a resume may give away
        if array.nbytes:
            assert array.ctypes.data % ALIGNMENT == 0
    assert not np.shares_memory(loaded["/kernel"], loaded["/bias"])
    assert read_tensors(loaded) is loaded  # what from_files gets passes through


def test_a_damaged_index_or_overlapping_arrays_come_back_as_the_files_bytes_checksummed():
    garbage = b"\xff" * 40
    loaded, digest = read(garbage)
    assert loaded == garbage and digest == Checksum.of(garbage)
    header = json.dumps({"/a": {"dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8},
                         "/b": {"dtype": "float32", "shape": [2], "offset": 4, "nbytes": 8}}).encode()
    overlapping = struct.pack("<Q", len(header)) + header + bytes(12)
    loaded, digest = read(overlapping)
    assert loaded == overlapping and digest == Checksum.of(overlapping)


def test_a_stream_that_ends_early_is_an_error():
    data = file_bytes(ARRAYS)
    with pytest.raises(EOFError):
        read_into_buffers(io.BytesIO(data[:-3]), len(data), Checksum())


def checkpoint(tmp_path, url: str) -> FsspecCheckpointIO:
    store = FsspecCheckpointIO(Location(url))
    sid = "0123456789ab-1"
    store.write("step-00000001", {f"model-00000.{sid}.tensors": file_bytes(ARRAYS), f"trainer.{sid}.json": b"{}"},
                {"step": 1, "epoch": 0, "save_id": sid, "run_id": "0123456789ab", "owner": "test"})
    return store


def test_a_local_restore_reads_arrays_and_still_refuses_a_flipped_byte(tmp_path):
    store = checkpoint(tmp_path, str(tmp_path / "ckpts"))
    _, files = store.read("step-00000001", arrays=True)
    name = next(name for name in files if name.endswith(".tensors"))
    assert isinstance(files[name], LoadedTensors)
    np.testing.assert_array_equal(files[name]["/kernel"], ARRAYS["/kernel"])
    assert isinstance(store.read("step-00000001")[1][name], bytes)  # a plain read keeps the bytes
    path = tmp_path / "ckpts" / "step-00000001" / name
    damaged = bytearray(path.read_bytes())
    damaged[-9] ^= 0x01  # inside the arrays, past the index
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="does not match its crc32c checksum"):
        store.read("step-00000001", arrays=True)


def test_a_restore_from_object_storage_keeps_the_bytes(tmp_path):
    store = checkpoint(tmp_path, f"memory://tensor-read-{tmp_path.name}")
    _, files = store.read("step-00000001", arrays=True)
    assert all(isinstance(data, bytes) for data in files.values())
    store.fs.rm(store.root, recursive=True)
