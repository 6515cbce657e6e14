"""TensorBoard event files, written locally or staged locally and uploaded to any fsspec URL.

Written in the `tensorboard` package's record and summary format (`event_file.py`), so logging needs and
imports no TensorFlow: the same tags, steps and summaries (`tf.summary.scalar`'s) on every Keras backend.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.plugins.hparams.summary_v2 import hparams_pb
from tensorboard.plugins.scalar.summary_v2 import scalar_pb

from ktrainer.loggers.event_file import EventFile
from ktrainer.loggers.logger import Logger

__all__ = ["TensorBoardLogger"]

EPOCH = "epoch"


class TensorBoardLogger(Logger):
    """Writes scalars and hyperparameters as TensorBoard event files.

    On a local disk, the event files are written in place. On a remote filesystem (s3://,
    gs://, memory://, ...), they are written to a local staging folder and uploaded to
    `log_dir` at each flush (every `flush_secs`, at each epoch end and when the run ends), so
    that `tensorboard --logdir` on the remote folder, or on a copy of it, shows the run.

    `epoch` is written once per logged step, and the hyperparameters once per run folder: a run
    resumed from a checkpoint appends to the same folder without a second HPARAMS session.

    Args:
        save_dir: Root directory; None: the Trainer's `default_root_dir`.
        name: Sub-directory under `save_dir`.
        version: Version number or folder name; None picks the next free one.
        flush_secs: Flush (and upload) at most this often while training.
        storage_options: Passed to the fsspec filesystem.
    """

    def __init__(self, save_dir: str | None = None, name: str = "tensorboard",
                 version: int | str | None = None, flush_secs: float = 30.0,
                 storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(save_dir, name, version, storage_options)
        self.flush_secs = flush_secs
        self._writer = None
        self._staging: str | None = None
        self._last_flush = time.monotonic()
        self._epoch_step: int | None = None  # the step of the last `epoch` scalar written
        self._hparams_dir: str | None = None  # the canonical URL of the folder that holds the hyperparameters

    @property
    def writer(self) -> EventFile:
        """The event-file writer (created at first use, by the chief only: elsewhere nothing is written)."""
        if self._writer is None:
            location = self.location
            if location.is_local:
                directory = location.path
            else:
                self._staging = tempfile.mkdtemp(prefix="ktrainer-tb-")
                directory = self._staging
            self._writer = EventFile(directory)
        return self._writer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Write each metric as a scalar at `step`; `epoch` only at the first call for a step."""
        if not self.writes:
            return
        # The Trainer adds `epoch` to every call, and a step can have several (its metrics, the
        # learning rate, validation, the epoch's metrics): TensorBoard would hold one point per call.
        if EPOCH in metrics:
            if step == self._epoch_step:
                metrics = {name: value for name, value in metrics.items() if name != EPOCH}
            else:
                self._epoch_step = step
        wall_time = time.time()
        for name, value in metrics.items():
            self.writer.add_event(Event(wall_time=wall_time, step=int(step), summary=scalar_pb(name, float(value))))
        if time.monotonic() - self._last_flush > self.flush_secs:
            self.flush()

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Write the hyperparameters for TensorBoard's HPARAMS tab, unless the run's folder holds them already.

        Each write starts an HPARAMS session, so a resumed run, which appends to its folder, writes none.
        """
        if not params or not self.writes or self._hparams_dir == self.location.canonical_url:
            return
        clean = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in params.items()}
        self.writer.add_event(Event(wall_time=time.time(), step=0, summary=hparams_pb(clean)))
        self._hparams_dir = self.location.canonical_url

    def flush(self) -> None:
        """Flush the event files and, for a remote `log_dir`, upload them."""
        self._last_flush = time.monotonic()
        if self._writer is None:
            return
        self._writer.flush()
        if self._staging is not None:
            for file_name in sorted(os.listdir(self._staging)):
                self.location.upload(os.path.join(self._staging, file_name), file_name)

    def state_dict(self) -> dict[str, Any]:
        """The version, and what a resumed run must not write twice: the last `epoch` step and the hyperparameters."""
        return {**super().state_dict(), "epoch_step": self._epoch_step, "hparams_dir": self._hparams_dir}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the saved version (see `Logger.load_state_dict`) and what the saved run wrote in its folder."""
        super().load_state_dict(state)
        if self._version == state.get("version"):  # appending to the saved run's folder
            self._epoch_step = state.get("epoch_step", self._epoch_step)
        self._hparams_dir = state.get("hparams_dir", self._hparams_dir)

    def finalize(self, status: str) -> None:
        """Flush, upload and close the writer."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
