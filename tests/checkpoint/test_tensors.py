"""The tensor file on its own: its byte layout, every dtype bit-exact, no copies either way, and each bad index entry
refused with a ValueError that names the entry and what is wrong with it.

(tests/checkpoint/test_snapshot.py covers the file as a checkpoint uses it: truncation, non-JSON indexes, big-endian
input, float8, sizes changing mid-write.)
"""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from ktrainer.checkpoint.tensors import TensorFile, dtype_from_name, nbytes_of, read_tensors

pytestmark = pytest.mark.both_backends

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "complex64", "complex128", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "int4", "uint4"]


def file_bytes(arrays: dict, **kwargs) -> bytes:
    return b"".join(bytes(chunk) for chunk in TensorFile(arrays, **kwargs).chunks())


def with_index(index: dict, body: bytes = b"") -> bytes:
    encoded = json.dumps(index).encode()
    return struct.pack("<Q", len(encoded)) + encoded + body


def entry(**changes) -> dict:
    """A good index entry for a float32 array of shape [2], with `changes` applied."""
    return {"dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8, **changes}


class Variable:
    """Stands for a live variable: a shape and a dtype name, its value only through `read`."""

    def __init__(self, value: np.ndarray, dtype: str | None = None) -> None:
        self.value, self.shape, self.dtype = value, value.shape, dtype or value.dtype.name


def test_the_layout_is_a_length_then_a_json_index_then_each_arrays_little_endian_bytes_in_order():
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], dtype=">i2"),
              "step": np.array(7, np.int64)}
    data = file_bytes(arrays)
    (length,) = struct.unpack_from("<Q", data)
    index = json.loads(data[8:8 + length])
    assert index == {
        "w": {"dtype": "float32", "shape": [2, 3], "offset": 0, "nbytes": 24},
        "b": {"dtype": "int16", "shape": [2], "offset": 24, "nbytes": 4},
        "step": {"dtype": "int64", "shape": [], "offset": 28, "nbytes": 8},
    }
    body = data[8 + length:]
    assert body == arrays["w"].tobytes() + np.array([1, -2], "<i2").tobytes() + np.int64(7).tobytes()
    assert len(data) == TensorFile(arrays).nbytes


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips_bit_exact_under_its_name(name):
    dtype = dtype_from_name(name)
    values = np.arange(-3, 5) % 2 if name == "bool" else np.arange(0, 8) if name.startswith("u") else np.arange(-3, 5)
    array = values.astype(dtype).reshape(2, 4)
    data = file_bytes({"x": array})
    assert json.loads(data[8:8 + struct.unpack_from("<Q", data)[0]])["x"]["dtype"] == name
    loaded = read_tensors(data)["x"]
    assert loaded.dtype == dtype and loaded.shape == (2, 4)
    assert loaded.tobytes() == array.tobytes()


def test_non_contiguous_arrays_are_written_in_c_order():
    fortran = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    strided = np.arange(20, dtype=np.float64)[::3]
    transposed = np.arange(6, dtype=np.uint8).reshape(2, 3).T
    loaded = read_tensors(file_bytes({"fortran": fortran, "strided": strided, "transposed": transposed}))
    for name, original in (("fortran", fortran), ("strided", strided), ("transposed", transposed)):
        np.testing.assert_array_equal(loaded[name], original)
        assert loaded[name].flags.c_contiguous


def test_an_arrays_bytes_are_streamed_from_its_own_memory_without_a_copy():
    array = np.arange(1000, dtype=np.float32)
    chunks = list(TensorFile({"x": array}).chunks())
    assert len(chunks) == 2  # the header, then the array
    assert np.shares_memory(np.frombuffer(chunks[1], np.uint8), array)


def test_an_empty_array_adds_no_chunk_and_no_bytes():
    source = TensorFile({"empty": np.zeros((0, 5), np.float32), "x": np.ones(2, np.float32)})
    chunks = list(source.chunks())
    assert len(chunks) == 2 and sum(memoryview(chunk).nbytes for chunk in chunks) == source.nbytes
    loaded = read_tensors(b"".join(bytes(chunk) for chunk in chunks))
    assert loaded["empty"].shape == (0, 5) and loaded["empty"].dtype == np.float32


def test_read_arrays_are_views_of_the_data_not_copies():
    data = bytearray(file_bytes({"x": np.arange(4, dtype=np.int32)}))
    loaded = read_tensors(data)["x"]
    assert np.shares_memory(loaded, np.frombuffer(data, np.uint8))
    data[-4:] = np.int32(99).tobytes()
    assert loaded[-1] == 99
    assert not read_tensors(bytes(data))["x"].flags.writeable  # over immutable bytes: read-only


def test_variables_are_read_one_at_a_time_as_the_chunks_are_consumed():
    variables = {name: Variable(np.full(3, i, np.float32)) for i, name in enumerate("abc")}
    reads = []

    def read(variable):
        reads.append(variable)
        return variable.value

    source = TensorFile(variables, read=read)
    chunks = source.chunks()
    header = next(chunks)  # sized, and the header made, without reading a value
    assert reads == [] and source.nbytes == len(header) + 36
    for count, name in enumerate("abc", start=1):
        assert np.frombuffer(next(chunks), np.float32).tolist() == [count - 1] * 3
        assert reads == [variables[name] for name in "abc"[:count]]


def test_a_value_read_in_another_dtype_is_stored_in_the_declared_one():
    variable = Variable(np.array([0.1, 2.5, -3.0]), dtype="bfloat16")  # reads as float64
    loaded = read_tensors(file_bytes({"x": variable}, read=lambda v: v.value))["x"]
    assert loaded.dtype == np.dtype(ml_dtypes.bfloat16)
    assert loaded.tobytes() == np.array([0.1, 2.5, -3.0]).astype(ml_dtypes.bfloat16).tobytes()


def test_nbytes_of_comes_from_shape_and_dtype_without_reading_the_value():
    class Unreadable:
        shape, dtype = (3, 5), "bfloat16"

        def __array__(self, *args, **kwargs):
            raise AssertionError("read")

    assert nbytes_of(Unreadable()) == 30
    assert nbytes_of(np.zeros((2, 0, 4))) == 0
    assert nbytes_of(np.zeros((), np.complex128)) == 16
    source = TensorFile({"u": Unreadable(), "v": Unreadable()})
    assert source.nbytes == len(next(source.chunks())) + 60  # sized, header made, neither read


@pytest.mark.parametrize("name", ["float33", "__class__", "_private", "bfloat 16", ""])
def test_a_name_that_is_no_dtype_is_refused_by_name(name):
    with pytest.raises(ValueError, match=f"unknown dtype {name!r} in a tensor file"):
        dtype_from_name(name)


@pytest.mark.parametrize("bad, message", [
    ("not an entry", "entry 'x' is not an object"),
    ({"shape": [2], "offset": 0, "nbytes": 8}, "entry 'x' has no usable dtype"),
    (entry(dtype="float33"), "unknown dtype 'float33'"),
    (entry(shape=2), "entry 'x' has a bad shape 2"),
    (entry(shape=[-2]), r"entry 'x' has a bad shape \[-2\]"),
    (entry(shape=[True, 2]), r"entry 'x' has a bad shape \[True, 2\]"),
    (entry(shape=[2.0]), r"entry 'x' has a bad shape \[2.0\]"),
    (entry(offset=None), "entry 'x' has a bad offset None"),
    (entry(nbytes=8.0), "entry 'x' has a bad nbytes 8.0"),
    (entry(nbytes=True), "entry 'x' has a bad nbytes True"),
    (entry(nbytes=12), r"entry 'x' declares 12 bytes for shape \[2\] of float32"),
    (entry(shape=[2**64], nbytes=4), r"entry 'x' declares 4 bytes for shape \[18446744073709551616\]"),
    (entry(shape=[2**62, 4], nbytes=0), r"entry 'x' declares 0 bytes for shape"),
    (entry(dtype="V0", nbytes=0), "entry 'x' has dtype 'V0', which holds no numbers"),
    (entry(dtype="object"), "entry 'x' has dtype 'object', which holds no numbers"),
], ids=["not-object", "no-dtype", "unknown-dtype", "shape-not-list", "negative-dim", "bool-dim", "float-dim",
        "no-offset", "float-nbytes", "bool-nbytes", "nbytes-not-shape", "huge-shape", "overflowing-shape",
        "empty-dtype", "object-dtype"])
def test_each_bad_index_entry_is_refused_naming_the_entry_and_the_problem(bad, message):
    with pytest.raises(ValueError, match=message):
        read_tensors(with_index({"x": bad}, b"\x00" * 64))


def test_an_entry_may_be_read_from_any_offset_in_the_body():
    body = np.array([5, 6], np.float32).tobytes() + np.array([1, 2], np.float32).tobytes()
    loaded = read_tensors(with_index({"late": entry(offset=8), "early": entry(offset=0)}, body))
    assert loaded["late"].tolist() == [1, 2] and loaded["early"].tolist() == [5, 6]
