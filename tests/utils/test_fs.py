"""Locations on any fsspec filesystem: one canonical URL per place, whole-file writes and reads (atomic on a local
disk), listings, uploads, and the next free `version_N` -- on a local disk, memory:// and a real S3 server."""

from __future__ import annotations

import os

import fsspec
import pytest

from ktrainer.utils.fs import Location, next_version

pytestmark = pytest.mark.both_backends


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path) -> str:
    """An empty directory's URL (not created yet), on the local disk or in memory://."""
    if request.param == "local":
        yield str(tmp_path / "root")
        return
    yield f"memory://fs-{tmp_path.name}"
    memory = fsspec.filesystem("memory")
    if memory.exists(f"/fs-{tmp_path.name}"):
        memory.rm(f"/fs-{tmp_path.name}", recursive=True)


def test_every_spelling_of_a_local_directory_has_one_canonical_url(tmp_path):
    real = tmp_path / "runs"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    expected = "file://" + os.path.realpath(real)
    spellings = ["runs", "./runs", "runs/", str(real), f"file://{real}", str(tmp_path / "link"), "link/"]
    assert os.getcwd() == str(tmp_path)  # the relative spellings are relative to it (conftest changes into it)
    assert {spelling: Location(spelling).canonical_url for spelling in spellings} == dict.fromkeys(spellings, expected)


@pytest.mark.parametrize("spellings, expected", [
    (["memory://runs", "memory:///runs/", "memory://runs//"], "memory://runs"),
    (["s3://bucket/a/b", "s3://bucket/a//b/", "s3a://bucket/a/b"], "s3://bucket/a/b"),
], ids=["memory", "s3"])
def test_a_remote_location_is_canonical_as_protocol_and_normalized_path(spellings, expected):
    assert {Location(spelling).canonical_url for spelling in spellings} == {expected}


def test_a_location_knows_whether_it_is_on_the_local_disk(tmp_path):
    assert Location(str(tmp_path)).is_local and Location(f"file://{tmp_path}").is_local
    assert not Location("memory://somewhere").is_local
    assert Location(f"file://{tmp_path}").path == str(tmp_path)
    assert Location("memory://somewhere/deep").path == "/somewhere/deep"


def test_join_appends_parts_and_keeps_the_storage_options():
    options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}}
    child = Location("s3://bucket/runs/", options).join("csv", "version_0")
    assert child.url == "s3://bucket/runs/csv/version_0" and str(child) == child.url
    assert child.storage_options == options


def test_write_bytes_creates_the_directory_and_read_bytes_returns_the_same_bytes(root):
    location = Location(root).join("a", "b")
    assert not location.exists()
    data = bytes(range(256)) * 3
    location.write_bytes("blob.bin", data)
    assert location.exists() and location.read_bytes("blob.bin") == data
    location.write_bytes("blob.bin", b"shorter", atomic=True)  # atomic is accepted everywhere
    assert location.read_bytes("blob.bin") == b"shorter"
    assert location.children() == ["blob.bin"]


def test_an_atomic_local_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    location = Location(str(tmp_path / "logs"))
    location.write_bytes("metrics.csv", b"old contents\n")
    with open(tmp_path / "logs" / "metrics.csv", "rb") as reader:
        location.write_bytes("metrics.csv", b"new\n", atomic=True)
        assert reader.read() == b"old contents\n"  # a reader keeps the whole old file (a plain write truncates it)
    assert (tmp_path / "logs" / "metrics.csv").read_bytes() == b"new\n"
    assert os.listdir(tmp_path / "logs") == ["metrics.csv"]


def test_children_are_the_sorted_base_names_and_none_for_a_missing_location(root):
    location = Location(root)
    assert location.children() == [] and not location.exists()
    for name in ("b.txt", "a.txt", "version_10"):
        location.write_bytes(name, b"x")
    location.join("nested").write_bytes("deep.txt", b"x")
    assert location.children() == ["a.txt", "b.txt", "nested", "version_10"]


def test_makedirs_is_idempotent(root):
    location = Location(root).join("x", "y")
    location.makedirs()
    location.makedirs()
    assert location.children() == []
    if location.is_local:
        assert os.path.isdir(location.path)


def test_upload_copies_a_local_file_under_the_location(root, tmp_path):
    source = tmp_path / "events.out"
    source.write_bytes(b"\x00\x01event bytes\xff")
    location = Location(root).join("tensorboard")
    location.upload(str(source), "events.out.1")
    assert location.read_bytes("events.out.1") == b"\x00\x01event bytes\xff"
    assert source.read_bytes() == b"\x00\x01event bytes\xff"


def test_the_next_version_follows_the_highest_one_and_ignores_other_names(root):
    parent = Location(root)
    assert next_version(parent) == 0  # not even there yet
    parent.makedirs()
    assert next_version(parent) == 0
    for name in ("version_0", "version_3", "version_x", "version_7.bak", "Version_9", "my_version_8", "version_-2"):
        parent.join(name).write_bytes("f", b"x")
    assert next_version(parent) == 4  # after the highest, not the count, and gaps are not reused
    parent.join("version_010").write_bytes("f", b"x")
    assert next_version(parent) == 11


def test_on_s3_a_location_needs_no_directories_and_its_options_reach_the_filesystem(s3_bucket):
    bucket, options = s3_bucket
    location = Location(f"{bucket}/runs/", options)
    assert not location.is_local and location.canonical_url == f"{bucket}/runs"
    assert location.children() == [] and next_version(location) == 0
    location.join("version_0").write_bytes("metrics.csv", b"step\n1\n")
    location.join("version_1").write_bytes("hparams.json", b"{}", atomic=True)
    assert location.exists() and location.children() == ["version_0", "version_1"]
    assert location.join("version_0").read_bytes("metrics.csv") == b"step\n1\n"
    assert next_version(location) == 2
