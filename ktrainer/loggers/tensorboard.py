"""TensorBoard event files, written locally or staged locally and uploaded to any fsspec URL."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

from ktrainer.loggers.logger import Logger

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(Logger):
    """Writes scalars and hyperparameters as TensorBoard event files.

    On a local disk, the event files are written in place. On a remote filesystem (s3://,
    gs://, memory://, ...), they are written to a local staging folder and uploaded to
    `log_dir` at each flush (every `flush_secs`, at each epoch end and when the run ends), so
    that `tensorboard --logdir` on the remote folder, or on a copy of it, shows the run.

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

    @property
    def writer(self) -> tf.summary.SummaryWriter:
        """The summary writer (created at first use)."""
        if self._writer is None:
            location = self.location
            if location.is_local:
                directory = location.path
            else:
                self._staging = tempfile.mkdtemp(prefix="ktrainer-tb-")
                directory = self._staging
            self._writer = tf.summary.create_file_writer(directory, flush_millis=int(self.flush_secs * 1000))
        return self._writer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Write each metric as a scalar at `step`."""
        with self.writer.as_default(step=step):
            for name, value in metrics.items():
                tf.summary.scalar(name, value)
        if time.monotonic() - self._last_flush > self.flush_secs:
            self.flush()

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Write the hyperparameters for TensorBoard's HPARAMS tab."""
        if not params:
            return
        clean = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in params.items()}
        with self.writer.as_default():
            hparams_api.hparams(clean)

    def flush(self) -> None:
        """Flush the event files and, for a remote `log_dir`, upload them."""
        self._last_flush = time.monotonic()
        if self._writer is None:
            return
        self._writer.flush()
        if self._staging is not None:
            for file_name in sorted(os.listdir(self._staging)):
                self.location.upload(os.path.join(self._staging, file_name), file_name)

    def finalize(self, status: str) -> None:
        """Flush, upload and close the writer."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
