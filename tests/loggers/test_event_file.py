"""EventFile: a TensorBoard event file TensorBoard's own reader takes, one new file per writer, no TensorFlow."""

from __future__ import annotations

import itertools
import time

import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.plugins.scalar.summary_v2 import scalar_pb

from ktrainer.loggers import event_file
from ktrainer.loggers.event_file import EventFile
from tests.helpers import read_scalars

pytestmark = pytest.mark.both_backends


def test_tensorboards_reader_reads_back_every_scalar_at_its_step(tmp_path):
    events = EventFile(str(tmp_path / "new" / "folder"))  # the folder is made
    for step, value in [(1, 0.5), (2, 0.25), (5, 0.125)]:
        events.add_event(Event(wall_time=time.time(), step=step, summary=scalar_pb("train/loss", value)))
    events.close()
    assert read_scalars(str(tmp_path / "new" / "folder")) == {"train/loss": [(1, 0.5), (2, 0.25), (5, 0.125)]}
    first = next(iter(EventFileLoader(events.path).Load()))
    assert first.file_version == "brain.Event:2"  # what TensorBoard expects at the head of a file


def test_what_is_flushed_is_readable_while_the_file_stays_open(tmp_path):
    events = EventFile(str(tmp_path))
    events.add_event(Event(wall_time=time.time(), step=3, summary=scalar_pb("val/loss", 2.0)))
    events.flush()
    assert read_scalars(str(tmp_path)) == {"val/loss": [(3, 2.0)]}
    events.close()


def test_writers_opened_in_the_same_second_write_separate_files_that_sort_in_opening_order(tmp_path, monkeypatch):
    monkeypatch.setattr(event_file, "_numbers", itertools.count(9))  # the 10th and 11th file of the process
    monkeypatch.setattr(event_file.time, "time", lambda: 1_800_000_000.5)
    first, second = EventFile(str(tmp_path)), EventFile(str(tmp_path))
    first.close()
    second.close()
    assert sorted([second.path, first.path]) == [first.path, second.path]  # TensorBoard reads them by name
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([first.path.split("/")[-1],
                                                                       second.path.split("/")[-1]])
    assert all(path.name.startswith("events.out.tfevents.") for path in tmp_path.iterdir())
