"""Saving in the background: `write` returns while the save runs, saves commit one after another, a failure is
raised once (by the next `write`, `wait()` or `close()`) and stops the next save, and `close()` stops the thread.

Saves go through a real FsspecCheckpointIO on a local disk; a `Gate` file holds a save in flight until the test
releases it, so nothing waits on a delay.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ktrainer.checkpoint.async_io import AsyncCheckpointIO
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError
from ktrainer.checkpoint.tensors import TensorFile
from ktrainer.utils.fs import Location

pytestmark = pytest.mark.both_backends

RUN = "0123456789ab"
TIMEOUT = 30


def data_name(save: int) -> str:
    return f"model-00000.{RUN}-{save}.tensors"


def fields(step: int) -> dict:
    return {"step": step, "save_id": f"{RUN}-{step}", "run_id": RUN}


class Gate:
    """A file whose bytes are held back until `release` is set; `started` is set when the store begins writing it."""

    def __init__(self, data: bytes = b"gated bytes") -> None:
        self.data, self.nbytes = data, len(data)
        self.started, self.release = threading.Event(), threading.Event()

    def chunks(self):
        self.started.set()
        if not self.release.wait(TIMEOUT):
            raise TimeoutError("the test never released this save")
        yield self.data


def async_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("ktrainer-async-save")}


@pytest.fixture
def inner(tmp_path):
    return FsspecCheckpointIO(Location(str(tmp_path / "ckpts")))


@pytest.fixture
def store(inner):
    store = AsyncCheckpointIO(inner)
    yield store
    try:
        store.close()
    except CheckpointError:
        pass  # a test's own failing save, already checked


@pytest.fixture
def gates(store):
    """Makes gates, and releases them all before `store` is closed (so a failing test cannot hang its teardown)."""
    made: list[Gate] = []

    def make(data: bytes = b"gated bytes") -> Gate:
        made.append(Gate(data))
        return made[-1]

    yield make
    for each in made:
        each.release.set()


def test_write_returns_while_the_save_runs_and_wait_returns_once_it_is_committed(store, inner, gates):
    held = gates()
    commits = []
    assert not store.in_flight
    assert store.write("step-00000001", {data_name(1): held}, fields(1),
                       on_commit=lambda info: commits.append((info, threading.current_thread().name))) is None
    assert held.started.wait(TIMEOUT)
    assert store.in_flight
    assert not any(info.valid for info in inner.list()) and commits == []  # nothing committed yet
    held.release.set()
    store.wait()
    assert not store.in_flight
    [(info, thread_name)] = commits
    assert info.valid and info.name == "step-00000001" and thread_name.startswith("ktrainer-async-save")
    assert inner.read("step-00000001")[1] == {data_name(1): b"gated bytes"}


def test_a_write_returns_only_after_the_save_before_it_committed(store, inner, gates):
    events = []
    first = gates(b"first")
    store.write("step-00000001", {data_name(1): first}, fields(1), on_commit=lambda info: events.append(info.name))
    assert first.started.wait(TIMEOUT)
    releaser = threading.Thread(target=first.release.set)
    releaser.start()  # releases the first save while (or before) the second write waits for it
    store.write("step-00000002", {data_name(2): b"second"}, fields(2), on_commit=lambda info: events.append(info.name))
    events.append("second write returned")
    store.wait()
    releaser.join()
    assert events == ["step-00000001", "second write returned", "step-00000002"]
    assert [info.name for info in inner.list() if info.valid] == ["step-00000001", "step-00000002"]


def test_a_background_failure_is_raised_once_by_wait_and_the_store_then_saves_again(store, inner, tmp_path):
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "step-00000001").write_bytes(b"a user's file")
    store.write("step-00000001", {data_name(1): b"data"}, fields(1))  # fails in the background, not here
    with pytest.raises(CheckpointError, match="step-00000001 is a file, not a checkpoint directory"):
        store.wait()
    store.wait()  # raised once: nothing is pending any more
    assert (tmp_path / "ckpts" / "step-00000001").read_bytes() == b"a user's file"
    store.write("step-00000002", {data_name(2): b"data"}, fields(2))
    store.wait()
    assert inner.read("step-00000002")[1] == {data_name(2): b"data"}


def test_a_background_failure_is_raised_by_the_next_write_which_then_does_not_start(store, inner, tmp_path):
    growing = TensorFile({"w": np.zeros(3, np.float32)}, read=lambda _: np.zeros(4, np.float32))
    store.write("step-00000001", {data_name(1): growing}, fields(1))
    with pytest.raises(CheckpointError, match=r"Saving checkpoint .*step-00000001 failed.*changed size") as raised:
        store.write("step-00000002", {data_name(2): b"data"}, fields(2))
    assert isinstance(raised.value.__cause__, ValueError)
    assert not store.in_flight
    assert not (tmp_path / "ckpts" / "step-00000001").exists()  # the failed save left nothing behind
    assert not (tmp_path / "ckpts" / "step-00000002").exists()  # and the next one never started
    assert inner.list() == []


def test_close_waits_for_the_save_in_flight_then_stops_the_thread(store, inner, gates):
    before = async_threads()
    held = gates()
    store.write("step-00000001", {data_name(1): held}, fields(1))
    assert held.started.wait(TIMEOUT)
    started = async_threads() - before
    assert len(started) == 1
    releaser = threading.Thread(target=held.release.set)
    releaser.start()
    store.close()
    releaser.join()
    assert inner.read("step-00000001")[1] == {data_name(1): b"gated bytes"}
    assert not any(thread.is_alive() for thread in started)


def test_close_raises_the_background_failure_and_still_stops_the_thread(store, tmp_path):
    before = async_threads()
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "step-00000001").write_bytes(b"in the way")
    store.write("step-00000001", {data_name(1): b"data"}, fields(1))
    started = async_threads() - before
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
        store.close()
    assert started and not any(thread.is_alive() for thread in started)
    store.close()  # closing again: nothing to wait for, nothing raised


def test_write_options_reach_the_wrapped_store(store, inner):
    later = time.time() + 3600.0
    store.write("step-00000001", {data_name(1): b"data"}, fields(1), not_before=later)
    store.wait()
    [info] = inner.list()
    assert info.committed == later


def test_reads_listings_and_deletes_go_straight_to_the_wrapped_store(store, inner):
    inner.write("step-00000001", {data_name(1): b"one"}, fields(1))
    inner.write("step-00000002", {data_name(2): b"two"}, fields(2))
    assert store.url == inner.url
    assert store.read("step-00000002")[1] == {data_name(2): b"two"}
    [info] = store.list(checksums=True, names=["step-00000001"])
    assert info.name == "step-00000001" and info.valid and info.checksums_checked
    store.delete("step-00000001")
    assert [info.name for info in inner.list()] == ["step-00000002"]
    assert not store.in_flight
