"""The storage boundary: what a listing entry says of a checkpoint (with or without a usable manifest), and the
buffers a `FileSource` may hand a store, written byte for byte.

(tests/checkpoint/test_fsspec_io.py covers the store itself: the commit protocol, validity, deletion.)
"""

from __future__ import annotations

import dataclasses

import fsspec
import numpy as np
import pytest

from ktrainer.checkpoint.format import FileEntry, encode_manifest, parse_manifest
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError, CheckpointInfo
from ktrainer.checkpoint.tensors import TensorFile, read_tensors
from ktrainer.utils.fs import Location

pytestmark = pytest.mark.both_backends

RUN = "0123456789ab"
SAVE = f"{RUN}-1"


def manifest(step: int = 1200, committed: float = 1_700_000_000.5):
    files = [FileEntry(f"model-00000.{SAVE}.tensors", 1000, "crc32c", "0a1b2c3d"),
             FileEntry(f"trainer.{SAVE}.json", 24, "crc32c", "ffffffff")]
    fields = {"step": step, "epoch": 3, "committed": committed, "run_id": RUN, "metrics": {"val/loss": 0.25}}
    return parse_manifest(encode_manifest(fields, files))


class Buffers:
    """A FileSource made of the given buffers."""

    def __init__(self, *parts) -> None:
        self.parts = parts
        self.nbytes = sum(memoryview(part).nbytes for part in parts)

    def chunks(self):
        yield from self.parts


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        yield FsspecCheckpointIO(Location(str(tmp_path / "ckpts")))
        return
    yield FsspecCheckpointIO(Location(f"memory://io-{tmp_path.name}"))
    fsspec.filesystem("memory").rm(f"/io-{tmp_path.name}", recursive=True)


def test_an_entry_with_a_manifest_takes_step_fields_time_and_size_from_it():
    info = CheckpointInfo("s3://bucket/run/ckpts/step-00001200", True, manifest=manifest())
    assert info.name == "step-00001200"
    assert info.step == 1200
    assert info.fields["epoch"] == 3 and info.fields["metrics"] == {"val/loss": 0.25}
    assert info.committed == 1_700_000_000.5
    assert info.size == 1024


def test_the_manifests_step_wins_over_the_name():
    assert CheckpointInfo("/ckpts/best", True, manifest=manifest(step=7)).step == 7


@pytest.mark.parametrize("url, step", [
    ("/ckpts/step-00001200", 1200),
    ("memory://ckpts/step-00001200/", 1200),
    ("s3://bucket/step-123456789", 123456789),
    ("/ckpts/step-12", -1),
    ("/ckpts/best", -1),
], ids=["local", "trailing-slash", "nine-digits", "too-few-digits", "not-a-step"])
def test_without_a_usable_manifest_the_step_comes_from_the_name_or_is_minus_one(url, step):
    info = CheckpointInfo(url, False, reason="manifest is not valid JSON (truncated or corrupt)")
    assert info.step == step
    assert info.fields == {} and info.committed == 0.0 and info.size == 0


def test_the_name_is_the_last_part_of_the_url_with_or_without_a_trailing_slash():
    assert CheckpointInfo("s3://bucket/a/step-00000003/", True).name == "step-00000003"
    assert CheckpointInfo("file:///runs/ckpts/step-00000003", True).name == "step-00000003"
    assert CheckpointInfo("step-00000003", True).name == "step-00000003"


def test_an_entry_defaults_to_a_plain_committed_directory_and_cannot_be_changed():
    info = CheckpointInfo("/ckpts/step-00000001", True)
    assert (info.reason, info.manifest, info.checksums_checked, info.newer_format) == ("", None, False, None)
    assert (info.symlink, info.has_manifest, info.run_ids, info.storage_error) == (False, True, frozenset(), False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.valid = False  # type: ignore[misc]


def test_a_checkpoint_error_is_caught_as_a_runtime_error():
    assert issubclass(CheckpointError, RuntimeError)


@pytest.mark.parametrize("part", [
    b"bytes",
    memoryview(b"a memoryview"),
    np.arange(5, dtype=np.float32),
    memoryview(np.arange(6, dtype=np.int16).reshape(2, 3)),
    memoryview(b""),
    bytearray(b"a bytearray"),
], ids=["bytes", "memoryview", "numpy", "2d-memoryview", "empty", "bytearray"])
def test_a_file_source_may_yield_bytes_or_any_contiguous_buffer(store, part):
    name = f"model-00000.{SAVE}.tensors"
    info = store.write("step-00000001", {name: Buffers(b"head:", part, b":tail")}, {"step": 1, "save_id": SAVE})
    expected = b"head:" + memoryview(part).tobytes() + b":tail"
    assert info.size == len(expected)
    assert store.read("step-00000001")[1] == {name: expected}


def test_a_tensor_file_is_a_file_source_the_store_writes_as_it_reads_back(store):
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.array(7, np.int64)}
    source = TensorFile(arrays)
    name = f"model-00000.{SAVE}.tensors"
    info = store.write("step-00000001", {name: source}, {"step": 1, "save_id": SAVE})
    assert info.size == source.nbytes
    loaded = read_tensors(store.read("step-00000001")[1][name])
    for key, value in arrays.items():
        assert loaded[key].tobytes() == value.tobytes() and loaded[key].dtype == value.dtype
