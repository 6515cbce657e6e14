"""Checkpoints: the format (format.py), the storage boundary (io.py, fsspec_io.py, async_io.py), what to
keep (retention.py), state <-> files (snapshot.py) and which checkpoint a ckpt_path means (resume.py)."""

from ktrainer.checkpoint.async_io import AsyncCheckpointIO
from ktrainer.checkpoint.format import FORMAT_VERSION, MANIFEST, checkpoint_name
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError, CheckpointInfo, CheckpointIO
from ktrainer.checkpoint.resume import find_checkpoint

__all__ = ["CheckpointIO", "FsspecCheckpointIO", "AsyncCheckpointIO", "CheckpointInfo", "CheckpointError",
           "find_checkpoint", "checkpoint_name", "FORMAT_VERSION", "MANIFEST"]
