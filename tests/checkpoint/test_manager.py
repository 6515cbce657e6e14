"""The commit protocol on local disk and memory://: manifest last, verification, never overwrite, own files only."""

from __future__ import annotations

import json

import fsspec
import pytest

from ktrainer.checkpoint.manager import CheckpointError, CheckpointManager
from ktrainer.fs import Location

FILES = {"model-00000.tensors": b"m" * 100, "optimizer-00000.tensors": b"o" * 50, "trainer.json": b"{}"}


@pytest.fixture(params=["local", "memory"])
def manager(request, tmp_path):
    if request.param == "local":
        yield CheckpointManager(Location(str(tmp_path / "ckpts")))
        return
    url = f"memory://manager-{tmp_path.name}"
    yield CheckpointManager(Location(url))
    fsspec.filesystem("memory").rm(f"/manager-{tmp_path.name}", recursive=True)


def test_save_writes_a_manifest_with_sizes_and_checksums(manager):
    info = manager.save("step-00000010", FILES, {"step": 10, "epoch": 1, "metrics": {"val/loss": 0.5}})
    assert info.valid and info.step == 10 and info.size == 152
    manifest = json.loads(manager.fs.cat_file(f"{manager.root}/step-00000010/manifest.json"))
    sizes = {f["name"]: f["size"] for f in manifest["files"]}
    assert sizes == {"model-00000.tensors": 100, "optimizer-00000.tensors": 50, "trainer.json": 2}
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])
    _, files = manager.read("step-00000010")
    assert files == FILES


def test_a_truncated_file_a_flipped_byte_or_no_manifest_is_not_a_checkpoint(manager):
    for step in (1, 2, 3):
        manager.save(f"step-{step:08d}", FILES, {"step": step})
    manager.fs.pipe_file(f"{manager.root}/step-00000001/model-00000.tensors", b"m" * 60)  # truncated
    manager.fs.pipe_file(f"{manager.root}/step-00000002/model-00000.tensors", b"x" + b"m" * 99)  # same size, corrupt
    manager.fs.rm_file(f"{manager.root}/step-00000003/manifest.json")  # interrupted before the manifest
    infos = manager.list()
    assert [(i.step, i.valid) for i in infos] == [(1, False), (2, True), (3, False)]
    assert "60 bytes, the manifest says 100 (truncated)" in infos[0].reason
    assert infos[2].reason == "no manifest (an interrupted save)"
    assert not manager.inspect("step-00000002", checksums=True).valid
    with pytest.raises(CheckpointError, match="model-00000.tensors does not match its checksum"):
        manager.read("step-00000002")


def test_a_valid_checkpoint_is_never_overwritten_and_an_invalid_one_is_replaced(manager):
    manager.save("step-00000005", FILES, {"step": 5})
    again = manager.save("step-00000005", {**FILES, "model-00000.tensors": b"new"}, {"step": 5})
    assert again.valid and manager.read("step-00000005")[1]["model-00000.tensors"] == b"m" * 100
    manager.fs.rm_file(f"{manager.root}/step-00000005/manifest.json")
    manager.save("step-00000005", {**FILES, "model-00000.tensors": b"new"}, {"step": 5})
    assert manager.read("step-00000005")[1]["model-00000.tensors"] == b"new"


def test_delete_removes_only_the_files_ktrainer_writes(manager):
    manager.save("step-00000001", FILES, {"step": 1})
    manager.fs.pipe_file(f"{manager.root}/step-00000001/notes.txt", b"mine")
    manager.fs.pipe_file(f"{manager.root}/README", b"mine too")
    manager.delete("step-00000001")
    assert manager.fs.cat_file(f"{manager.root}/step-00000001/notes.txt") == b"mine"
    assert manager.fs.cat_file(f"{manager.root}/README") == b"mine too"
    assert not manager.inspect("step-00000001").valid


def test_unreadable_manifest(manager):
    manager.save("step-00000001", FILES, {"step": 1})
    manager.fs.pipe_file(f"{manager.root}/step-00000001/manifest.json", b'{"format_version": 1, "fil')
    assert manager.inspect("step-00000001").reason == "manifest is not valid JSON (an interrupted save)"


def test_tensors_are_split_into_shards_and_read_back_whole(tmp_path, monkeypatch):
    import numpy as np

    from ktrainer.checkpoint import state as state_module
    from ktrainer.checkpoint.state import TrainingState

    monkeypatch.setattr(state_module, "SHARD_BYTES", 1000)
    arrays = {f"{i:05d}:layer/kernel{i}": np.full((10, 10), i, np.float32) for i in range(5)}  # 400 bytes each
    state = TrainingState(arrays, {"00000:iteration": np.array(3, np.int64)}, {"progress": {}})
    files = state.to_files()
    assert sorted(files) == ["model-00000.tensors", "model-00001.tensors", "model-00002.tensors",
                             "optimizer-00000.tensors", "trainer.json"]
    manager = CheckpointManager(Location(str(tmp_path)))
    manager.save("step-00000001", files, {"step": 1})
    loaded = TrainingState.from_files(manager.read("step-00000001")[1])
    assert list(loaded.model) == list(arrays)
    for key, value in arrays.items():
        np.testing.assert_array_equal(loaded.model[key], value)
    assert loaded.optimizer["00000:iteration"].shape == () and int(loaded.optimizer["00000:iteration"]) == 3
