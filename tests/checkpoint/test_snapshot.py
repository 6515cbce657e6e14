"""A training state <-> checkpoint files: bit-exact round trips, shards, file names, and malformed files refused."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from ktrainer.checkpoint import snapshot
from ktrainer.checkpoint.format import is_own_file, run_id_of_file
from ktrainer.checkpoint.snapshot import freeze, from_files, is_array, to_files
from ktrainer.checkpoint.tensors import TensorFile, dtype_from_name, read_tensors

pytestmark = pytest.mark.both_backends

RUN = "0123456789ab"
SAVE = f"{RUN}-7"


def materialize(files: dict) -> dict[str, bytes]:
    """The bytes a save would write: each TensorFile's chunks joined."""
    out = {}
    for name, content in files.items():
        if isinstance(content, TensorFile):
            data = b"".join(bytes(chunk) for chunk in content.chunks())
            assert len(data) == content.nbytes, name
            out[name] = data
        else:
            out[name] = content
    return out


def round_trip(state: dict, **kwargs) -> tuple[dict, dict]:
    return from_files(materialize(to_files(state, SAVE, **kwargs)))


def assert_same(loaded, original, where="state"):
    """Equal structure, bit-exact arrays of the same dtype and shape."""
    if is_array(original):
        original = np.asarray(original)
        assert isinstance(loaded, np.ndarray), where
        assert loaded.dtype == original.dtype, where
        assert loaded.shape == original.shape, where
        assert loaded.tobytes() == original.tobytes(), where
    elif isinstance(original, dict):
        assert isinstance(loaded, dict), where
        assert set(loaded) == set(original), where
        for key in original:
            assert_same(loaded[key], original[key], f"{where}/{key}")
    elif isinstance(original, list | tuple):
        assert isinstance(loaded, list), where
        assert len(loaded) == len(original), where
        for index, (a, b) in enumerate(zip(loaded, original, strict=True)):
            assert_same(a, b, f"{where}/{index}")
    else:
        assert loaded == original and type(loaded) is type(original), where


def rich_state() -> dict:
    rng = np.random.default_rng(0)
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 3.4e38], np.float32)
    return {
        "model": {
            "dense/kernel": rng.standard_normal((7, 5)).astype(np.float32),
            "dense/bias": special,
            "half": rng.standard_normal(9).astype(np.float16),
            "brain": rng.standard_normal((3, 4)).astype(ml_dtypes.bfloat16),
            "double": rng.standard_normal(4),
            "empty": np.zeros((0, 3), np.float32),
        },
        "optimizer": {
            "iterations": np.array(1200, np.int64),          # a 0-d array
            "counts": rng.integers(-2**62, 2**62, 6, dtype=np.int64),
            "mask": np.array([True, False, True]),
            "bytes": np.arange(256, dtype=np.uint8),
            "scale": np.float32(32768.0),                    # a numpy scalar
            "fortran": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
        },
        "progress": {"global_step": 1200, "epoch": 3, "epoch_sums": None, "pending": False, "seed": 12345,
                     "rate": 0.5, "name": "run"},
        "callbacks": {
            "EarlyStopping{'monitor': 'val/loss'}": {"best": 0.25, "wait": 1, "stopped_epoch": None},
            "Custom": {"history": [[1, 2], {"a": [np.arange(3, dtype=np.int64), "x"]}],
                       "nested": {"deeper": {"weights": np.ones((2, 2), np.float16)}},
                       "empty_list": [], "empty_dict": {}},
        },
        "run": {"hparams": {"lr": 1e-3, "layers": [64, 64], "name": None}, "global_batch_size": 32},
    }


def test_a_nested_state_round_trips_bit_exact_with_its_dtypes():
    state = rich_state()
    loaded, extra = round_trip(state)
    assert extra == {}
    assert_same(loaded, state)
    assert loaded["model"]["brain"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert loaded["optimizer"]["iterations"].shape == ()
    assert loaded["optimizer"]["scale"].shape == ()  # a numpy scalar comes back as a 0-d array
    assert np.isnan(loaded["model"]["dense/bias"][0])
    assert np.signbit(loaded["model"]["dense/bias"][1])


def test_loaded_arrays_are_read_only_views_and_json_stays_json():
    loaded, _ = round_trip(rich_state())
    assert not loaded["model"]["dense/kernel"].flags.writeable
    assert loaded["progress"] == rich_state()["progress"]
    trainer_json = json.loads(materialize(to_files(rich_state(), SAVE))[f"trainer.{SAVE}.json"])
    assert trainer_json["progress"]["global_step"] == 1200
    assert trainer_json["model"]["dense/kernel"] == {"__tensor__": ["model", "/dense~1kernel"]}  # "/" escaped


def test_tuples_come_back_as_lists():
    loaded, _ = round_trip({"run": {"shape": (1, 2), "pairs": ((np.int64(3), "a"),)}})
    assert loaded["run"]["shape"] == [1, 2]
    assert loaded["run"]["pairs"][0][0] == 3 and loaded["run"]["pairs"][0][1] == "a"


def test_arrays_go_to_shards_of_their_section_and_every_name_carries_the_save_id():
    files = to_files(rich_state(), SAVE, extra_json={"model_config": {"layers": 2}})
    assert set(files) == {f"model-00000.{SAVE}.tensors", f"optimizer-00000.{SAVE}.tensors",
                          f"callbacks-00000.{SAVE}.tensors", f"trainer.{SAVE}.json", f"model_config.{SAVE}.json"}
    for name in files:
        assert is_own_file(name), name
        assert run_id_of_file(name) == RUN, name
    assert set(files[f"callbacks-00000.{SAVE}.tensors"].arrays) == {
        "/Custom/history/1/a/0", "/Custom/nested/deeper/weights"}


def test_a_state_without_arrays_writes_only_the_state_file():
    files = to_files({"progress": {"epoch": 1}}, SAVE)
    assert list(files) == [f"trainer.{SAVE}.json"]
    assert from_files(files) == ({"progress": {"epoch": 1}}, {})


def test_extra_json_files_round_trip_by_base_name():
    config = {"class_name": "Sequential", "layers": [{"units": 3}], "dtype": None}
    loaded, extra = round_trip({"progress": {"epoch": 1}}, extra_json={"model_config": config})
    assert extra == {"model_config": config}
    assert loaded == {"progress": {"epoch": 1}}


def test_shards_are_cut_at_shard_bytes_and_an_oversized_array_gets_its_own(monkeypatch):
    monkeypatch.setattr(snapshot, "SHARD_BYTES", 100)
    arrays = {
        "a": np.arange(10, dtype=np.float32),    # 40 bytes
        "b": np.arange(10, dtype=np.float32),    # 40 -> 80
        "c": np.arange(10, dtype=np.float32),    # 40 -> would be 120: new shard
        "big": np.arange(100, dtype=np.int64),   # 800: alone
        "d": np.arange(5, dtype=np.float64),     # 40: after the big one, a new shard
        "e": np.zeros(0, np.float32),            # 0: fits with d
        "f": np.arange(15, dtype=np.float32),    # 60 -> 100: still fits
    }
    files = to_files({"model": arrays}, SAVE)
    shards = {name: content for name, content in files.items() if name.endswith(".tensors")}
    assert {name: list(content.arrays) for name, content in shards.items()} == {
        f"model-00000.{SAVE}.tensors": ["/a", "/b"],
        f"model-00001.{SAVE}.tensors": ["/c"],
        f"model-00002.{SAVE}.tensors": ["/big"],
        f"model-00003.{SAVE}.tensors": ["/d", "/e", "/f"],
    }
    loaded, _ = from_files(materialize(files))
    assert_same(loaded, {"model": arrays})


def test_a_variable_is_read_only_when_its_shard_is_written():
    class Variable:
        """Stands for a live variable: has shape and dtype, gives its value through `read`."""

        def __init__(self, value):
            self.value, self.shape, self.dtype = value, value.shape, value.dtype

    reads = []

    def read(variable):
        reads.append(variable)
        return variable.value

    weights = Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    files = to_files({"model": {"w": weights}}, SAVE, read=read)
    assert reads == []
    weights.value = weights.value * 2  # the shard holds the value at write time
    loaded, _ = from_files(materialize(files))
    assert reads == [weights]
    np.testing.assert_array_equal(loaded["model"]["w"], np.arange(6, dtype=np.float32).reshape(2, 3) * 2)


def test_an_array_changing_size_before_it_is_written_is_refused():
    value = np.zeros(3, np.float32)
    files = to_files({"model": {"w": value}}, SAVE, read=lambda _: np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="changed size"):
        materialize(files)


@pytest.mark.parametrize("section", ["Model", "model-1", "model.x", "", "mödel", "a b"])
def test_a_bad_section_name_is_refused(section):
    with pytest.raises(ValueError, match="section"):
        to_files({section: {"w": np.zeros(1)}}, SAVE)


def test_a_reference_to_a_missing_tensor_is_refused():
    files = materialize(to_files({"model": {"w": np.zeros(3)}, "optimizer": {"m": np.ones(2)}}, SAVE))
    del files[f"optimizer-00000.{SAVE}.tensors"]
    with pytest.raises(ValueError, match="optimizer/m"):
        from_files(files)


def test_a_missing_state_file_is_refused():
    files = materialize(to_files({"model": {"w": np.zeros(3)}}, SAVE))
    del files[f"trainer.{SAVE}.json"]
    with pytest.raises(ValueError, match="trainer"):
        from_files(files)


@pytest.mark.parametrize("cut", [1, 4, 200, 400])
def test_a_truncated_tensor_file_is_refused(cut):
    files = materialize(to_files({"model": {"w": np.arange(100, dtype=np.float32)}}, SAVE))
    name = f"model-00000.{SAVE}.tensors"
    files[name] = files[name][:-cut]  # the array has 400 bytes: every cut leaves the index whole
    with pytest.raises(ValueError, match="truncated"):
        from_files(files)


def test_freeze_makes_independent_host_copies():
    weights = np.arange(4, dtype=np.float32)
    state = {"model": {"w": weights}, "run": {"steps": [1, 2], "m": [np.ones(2)]}, "scale": np.float16(2.0)}
    frozen = freeze(state)
    weights[:] = -1
    state["run"]["m"][0][:] = 7
    state["run"]["steps"].append(3)
    state["model"]["new"] = 1
    np.testing.assert_array_equal(frozen["model"]["w"], np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(frozen["run"]["m"][0], np.ones(2))
    assert frozen["run"]["steps"] == [1, 2]
    assert "new" not in frozen["model"]
    assert frozen["scale"].dtype == np.float16 and frozen["scale"] == 2.0
    assert frozen["model"]["w"] is not weights


class FakeVariable:
    """Has a shape and a dtype, like a variable, but is no numpy array."""

    shape, dtype = (2,), np.dtype("float32")

    def __array__(self, dtype=None, copy=None):
        return np.zeros(2, np.float32)


def test_freeze_takes_variables_through_snapshot_and_copies_numpy_arrays():
    weights = np.zeros(2)
    frozen = freeze({"v": FakeVariable(), "w": weights}, snapshot=lambda value: np.asarray(value) + 1)
    np.testing.assert_array_equal(frozen["v"], np.ones(2))  # the variable went through snapshot
    weights[:] = 5
    np.testing.assert_array_equal(frozen["w"], np.zeros(2))  # the numpy array was copied, not snapshot


def test_strings_and_bytes_are_not_arrays():
    assert not is_array("abc") and not is_array(b"abc")
    assert is_array(np.zeros(2)) and is_array(np.float32(1))


def test_keys_containing_a_slash_do_not_collide_with_nested_keys():
    state = {"callbacks": {"a/b": np.zeros(2), "a": {"b": np.ones(2)}}}
    loaded, _ = round_trip(state)
    assert_same(loaded, state)


# ----- tensor files ---------------------------------------------------------------------------------


def tensor_file(arrays: dict) -> bytes:
    return b"".join(bytes(chunk) for chunk in TensorFile(arrays).chunks())


def with_index(index: bytes, body: bytes = b"") -> bytes:
    return struct.pack("<Q", len(index)) + index + body


def test_a_tensor_file_round_trips_and_declares_its_size():
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array(7, np.int64),
              "z": np.zeros((0,), np.uint8)}
    data = tensor_file(arrays)
    assert len(data) == TensorFile(arrays).nbytes
    assert_same(read_tensors(data), arrays)
    assert_same(read_tensors(memoryview(data)), arrays)


def test_big_endian_arrays_are_stored_little_endian():
    value = np.arange(3, dtype=">f4")
    loaded = read_tensors(tensor_file({"x": value}))["x"]
    np.testing.assert_array_equal(loaded, value)
    assert loaded.dtype == np.dtype("<f4")
    assert tensor_file({"x": value})[-4:] == np.float32(2).astype("<f4").tobytes()


@pytest.mark.parametrize("data", [b"", b"\x00" * 7], ids=["empty", "seven-bytes"])
def test_a_too_short_tensor_file_is_refused(data):
    with pytest.raises(ValueError, match="too short"):
        read_tensors(data)


def test_a_truncated_index_is_refused():
    data = tensor_file({"x": np.zeros(2)})
    (length,) = struct.unpack_from("<Q", data)
    with pytest.raises(ValueError, match="truncated in its index"):
        read_tensors(data[:8 + length - 1])
    with pytest.raises(ValueError, match="truncated in its index"):
        read_tensors(struct.pack("<Q", 2**63) + b"{}")


@pytest.mark.parametrize("index", [b"{not json", b"\xff\xfe\xfd", b'{"x": '])
def test_an_index_that_is_not_json_is_refused(index):
    with pytest.raises(ValueError, match="not valid JSON"):
        read_tensors(with_index(index))


def test_an_array_running_past_the_end_is_refused():
    index = json.dumps({"x": {"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}}).encode()
    with pytest.raises(ValueError, match="truncated in 'x'"):
        read_tensors(with_index(index, b"\x00" * 12))
    assert read_tensors(with_index(index, b"\x00" * 16))["x"].shape == (4,)


def test_a_negative_offset_is_refused():
    index = json.dumps({"x": {"dtype": "float32", "shape": [1], "offset": -4, "nbytes": 4}}).encode()
    with pytest.raises(ValueError, match="entry 'x' has a bad offset -4"):
        read_tensors(with_index(index, b"\x00" * 8))


def test_dtype_names_include_the_ml_dtypes_ones():
    assert dtype_from_name("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert dtype_from_name("float8_e4m3fn") == np.dtype(ml_dtypes.float8_e4m3fn)
    assert dtype_from_name("float32") == np.dtype(np.float32)
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_from_name("float33")


def test_float8_round_trips():
    value = np.linspace(-2, 2, 9).astype(ml_dtypes.float8_e4m3fn)
    assert_same(read_tensors(tensor_file({"x": value})), {"x": value})


@pytest.mark.parametrize("index", [b"[]", b'{"x": 1}', b'{"x": {"dtype": "float32"}}'])
def test_an_index_of_the_wrong_shape_is_refused_with_value_error(index):
    with pytest.raises(ValueError):
        read_tensors(with_index(index))
