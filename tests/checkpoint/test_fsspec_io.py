"""The commit protocol on local disk and memory://: manifest last and atomic, saves never touch committed files."""

from __future__ import annotations

import json
import os

import fsspec
import pytest

from ktrainer.checkpoint.format import MANIFEST
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError
from ktrainer.utils.fs import Location

RUN = "0123456789ab"


def files(save: int, model: bytes = b"m" * 100) -> dict[str, bytes]:
    sid = f"{RUN}-{save}"
    return {f"model-00000.{sid}.tensors": model, f"optimizer-00000.{sid}.tensors": b"o" * 50,
            f"trainer.{sid}.json": b"{}"}


def fields(step: int, save: int) -> dict:
    return {"step": step, "epoch": 1, "save_id": f"{RUN}-{save}", "run_id": RUN, "owner": "test"}


@pytest.fixture(params=["local", "memory"])
def io(request, tmp_path):
    if request.param == "local":
        yield FsspecCheckpointIO(Location(str(tmp_path / "ckpts")))
        return
    url = f"memory://io-{tmp_path.name}"
    yield FsspecCheckpointIO(Location(url))
    fsspec.filesystem("memory").rm(f"/io-{tmp_path.name}", recursive=True)


def listing(io, name):
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in io.fs.ls(f"{io.root}/{name}", detail=False))


def test_write_commits_a_manifest_with_sizes_and_crc32c(io):
    info = io.write("step-00000010", files(1), fields(10, 1))
    assert info.valid and info.step == 10 and info.size == 152
    manifest = json.loads(io.fs.cat_file(f"{io.root}/step-00000010/{MANIFEST}"))
    assert {f["name"]: f["size"] for f in manifest["files"]} == {name: len(data) for name, data in files(1).items()}
    assert all(len(f["crc32c"]) == 8 and int(f["crc32c"], 16) >= 0 for f in manifest["files"])
    assert manifest["format_version"] == 2 and manifest["committed"] > 0
    read_info, read_files = io.read("step-00000010")
    assert read_files == files(1) and read_info.checksums_checked


def test_a_new_save_of_the_same_name_replaces_it_and_removes_the_old_files_after(io):
    io.write("step-00000005", files(1), fields(5, 1))
    io.write("step-00000005", files(2, model=b"new"), fields(5, 2))
    _, read_files = io.read("step-00000005")
    assert read_files[f"model-00000.{RUN}-2.tensors"] == b"new"
    assert listing(io, "step-00000005") == sorted([MANIFEST, *files(2)])


def test_a_failing_save_leaves_the_committed_checkpoint_of_that_name_untouched(io):
    io.write("step-00000005", files(1), fields(5, 1))
    before = {n: io.fs.cat_file(f"{io.root}/step-00000005/{n}") for n in listing(io, "step-00000005")}

    class Failing:
        nbytes = 10

        def chunks(self):
            yield b"half"
            raise OSError("disk full")

    broken = {**files(2), f"optimizer-00000.{RUN}-2.tensors": Failing()}
    with pytest.raises(CheckpointError, match=r"Saving checkpoint .*step-00000005 failed: OSError\('disk full'\)"):
        io.write("step-00000005", broken, fields(5, 2))
    after = {n: io.fs.cat_file(f"{io.root}/step-00000005/{n}") for n in listing(io, "step-00000005")}
    assert after == before  # the new save's partial files were removed; the committed ones never touched
    assert io.read("step-00000005")[1] == files(1)


def test_a_truncated_file_a_flipped_bit_or_no_manifest_is_not_a_checkpoint(io):
    for step in (1, 2, 3):
        io.write(f"step-{step:08d}", files(step), fields(step, step))
    model = f"model-00000.{RUN}-1.tensors"
    io.fs.pipe_file(f"{io.root}/step-00000001/{model}", b"m" * 60)  # truncated
    flipped = bytearray(b"m" * 100)
    flipped[37] ^= 0x04
    io.fs.pipe_file(f"{io.root}/step-00000002/model-00000.{RUN}-2.tensors", bytes(flipped))  # same size
    io.fs.rm_file(f"{io.root}/step-00000003/{MANIFEST}")  # interrupted before the commit
    infos = io.list()
    assert [(i.step, i.valid) for i in infos] == [(1, False), (2, True), (3, False)]
    assert f"{model} has 60 bytes, the manifest says 100 (truncated)" in infos[0].reason
    assert infos[2].reason == "no manifest (an interrupted save)" and not infos[2].has_manifest
    assert infos[2].run_ids == {RUN}
    assert not io.list(checksums=True, names=["step-00000002"])[0].valid
    with pytest.raises(CheckpointError, match="does not match its crc32c checksum"):
        io.read("step-00000002")


def test_delete_removes_only_the_files_ktrainer_writes(io):
    io.write("step-00000001", files(1), fields(1, 1))
    io.fs.pipe_file(f"{io.root}/step-00000001/notes.txt", b"mine")
    io.fs.pipe_file(f"{io.root}/README", b"mine too")
    io.delete("step-00000001")
    assert io.fs.cat_file(f"{io.root}/step-00000001/notes.txt") == b"mine"
    assert io.fs.cat_file(f"{io.root}/README") == b"mine too"
    assert listing(io, "step-00000001") == ["notes.txt"]


def test_a_newer_format_is_neither_read_nor_overwritten(io):
    io.write("step-00000001", files(1), fields(1, 1))
    path = f"{io.root}/step-00000001/{MANIFEST}"
    manifest = json.loads(io.fs.cat_file(path))
    io.fs.pipe_file(path, json.dumps({**manifest, "format_version": 99}).encode())
    info = io.list()[0]
    assert not info.valid and info.newer_format == 99
    with pytest.raises(CheckpointError, match="written by a newer ktrainer .checkpoint format 99.*Upgrade ktrainer"):
        io.read("step-00000001")
    with pytest.raises(CheckpointError, match="format 99, written by a newer ktrainer; it is not overwritten"):
        io.write("step-00000001", files(2), fields(1, 2))
    assert json.loads(io.fs.cat_file(path))["format_version"] == 99


def test_a_file_named_like_a_checkpoint_is_listed_as_invalid_and_never_written_over(io):
    io.fs.makedirs(io.root, exist_ok=True)
    io.fs.pipe_file(f"{io.root}/step-00000007", b"a user's file")
    [info] = io.list()
    assert not info.valid and "a file named like a checkpoint" in info.reason
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
        io.write("step-00000007", files(1), fields(7, 1))
    assert io.fs.cat_file(f"{io.root}/step-00000007") == b"a user's file"


def test_symlinked_checkpoints_are_read_but_never_written_or_deleted_through(tmp_path):
    elsewhere = FsspecCheckpointIO(Location(str(tmp_path / "elsewhere")))
    elsewhere.write("step-00000001", files(1), fields(1, 1))
    io = FsspecCheckpointIO(Location(str(tmp_path / "ckpts")))
    os.makedirs(io.root)
    os.symlink(tmp_path / "elsewhere" / "step-00000001", tmp_path / "ckpts" / "step-00000001")
    [info] = io.list()
    assert info.valid and info.symlink
    assert io.read("step-00000001")[1] == files(1)
    with pytest.raises(CheckpointError, match="symbolic link; ktrainer never deletes through one"):
        io.delete("step-00000001")
    with pytest.raises(CheckpointError, match="symbolic link; ktrainer does not write through it"):
        io.write("step-00000001", files(2), fields(1, 2))
    assert elsewhere.read("step-00000001")[1] == files(1)


def test_the_local_commit_is_a_rename_so_a_reader_never_sees_a_partial_manifest(tmp_path, monkeypatch):
    io = FsspecCheckpointIO(Location(str(tmp_path)))
    io.write("step-00000001", files(1), fields(1, 1))
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((a, b)), real_replace(a, b)))
    io.write("step-00000001", files(2), fields(1, 2))
    assert [(os.path.basename(a), os.path.basename(b)) for a, b in renames] == [
        (f"{MANIFEST}.{RUN}-2.tmp", MANIFEST)]


def test_a_local_commit_is_durable_before_anything_old_is_deleted(tmp_path, monkeypatch):
    io = FsspecCheckpointIO(Location(str(tmp_path)))
    io.write("step-00000001", files(1), fields(1, 1))
    events = []
    real_fsync, real_replace, real_rm = os.fsync, os.replace, io.fs.rm_file

    def fsync(descriptor):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{descriptor}"))))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", os.path.basename(b))),
                                                     real_replace(a, b)))
    monkeypatch.setattr(io.fs, "rm_file", lambda path: (events.append(("delete", os.path.basename(path))),
                                                        real_rm(path)))
    io.write("step-00000001", files(2), fields(1, 2))  # replaces the first save's checkpoint of that name
    order = [kind for kind, _ in events]
    rename = order.index("rename")
    assert {name for kind, name in events[:rename] if kind == "fsync"} == {*files(2), f"{MANIFEST}.{RUN}-2.tmp"}
    assert events[rename + 1] == ("fsync", "step-00000001")  # the directory, so the rename itself is on the disk
    assert order.index("delete") > rename + 1 and {n for k, n in events if k == "delete"} == set(files(1))


def test_fsync_can_be_turned_off(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "fsync", calls.append)
    FsspecCheckpointIO(Location(str(tmp_path)), fsync=False).write("step-00000001", files(1), fields(1, 1))
    assert calls == []


def test_a_commit_whose_answer_was_lost_stands_when_its_manifest_is_there(io, monkeypatch, caplog):
    real_commit = io._commit

    def commit_then_lose_the_answer(*args):
        real_commit(*args)
        raise ConnectionResetError("the answer to the manifest PUT was lost")

    monkeypatch.setattr(io, "_commit", commit_then_lose_the_answer)
    with caplog.at_level("WARNING", logger="ktrainer"):
        info = io.write("step-00000003", files(1), fields(3, 1))
    assert info.valid and "but its manifest is there: the save stands" in caplog.text
    assert io.read("step-00000003")[1] == files(1)


def test_a_commit_that_did_not_happen_fails_and_keeps_its_files_as_leftovers(io, monkeypatch):
    io.write("step-00000003", files(1), fields(3, 1))

    def refuse(*args):
        raise ConnectionResetError("no answer")

    monkeypatch.setattr(io, "_commit", refuse)
    with pytest.raises(CheckpointError, match="step-00000003 failed: ConnectionResetError"):
        io.write("step-00000003", files(2, model=b"new"), fields(3, 2))
    assert io.read("step-00000003")[1] == files(1)  # the committed one stands
    # The new files stay (the commit might have landed unseen): leftovers no manifest lists.
    assert set(files(2)) <= set(listing(io, "step-00000003"))
