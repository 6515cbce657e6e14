"""One TensorBoard event file, written with plain file I/O and the `tensorboard` package's record format.

The `tensorboard` package's own writer creates its folder and file through `tensorboard.compat.tf`,
which imports TensorFlow wherever it is installed, even for a run on JAX; this writer never does.
"""

from __future__ import annotations

import itertools
import os
import socket
import time

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.record_writer import RecordWriter

__all__ = ["EventFile"]

# Tells apart the files one process opens within the same second, zero-padded so that names sort in opening
# order: TensorBoard reads a folder's files by name, and a resumed run's file read before the first run's
# would make it drop the first run's points as out of order.
_numbers = itertools.count()


class EventFile:
    """A new event file in `directory` (created if needed), named as TensorBoard's writers name theirs.

    Events are written in the calling thread and reach the disk at `flush` (or `close`).

    Args:
        directory: A local folder.
    """

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_numbers):06d}")
        self.path = os.path.join(directory, name)
        self._records = RecordWriter(open(self.path, "wb"))  # noqa: SIM115 - closed by close()
        self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def add_event(self, event: Event) -> None:
        """Append one event."""
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        """Hand what was written to the operating system."""
        self._records.flush()

    def close(self) -> None:
        """Flush and close the file."""
        self._records.close()
