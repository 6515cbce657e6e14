"""Checkpoints: the format (format.py), the storage boundary (io.py, fsspec_io.py, async_io.py), what to
keep (retention.py), state <-> files (snapshot.py) and which checkpoint a ckpt_path means (resume.py).

The names load on first use, so `ktrainer ckpt --help` does not pay for the tensor codecs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ktrainer.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from ktrainer.checkpoint.async_io import AsyncCheckpointIO
    from ktrainer.checkpoint.format import FORMAT_VERSION, MANIFEST, checkpoint_name
    from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
    from ktrainer.checkpoint.io import CheckpointError, CheckpointInfo, CheckpointIO
    from ktrainer.checkpoint.resume import find_checkpoint

__all__ = ["CheckpointIO", "FsspecCheckpointIO", "AsyncCheckpointIO", "CheckpointInfo", "CheckpointError",
           "find_checkpoint", "checkpoint_name", "FORMAT_VERSION", "MANIFEST"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "AsyncCheckpointIO": "ktrainer.checkpoint.async_io",
    "FORMAT_VERSION": "ktrainer.checkpoint.format",
    "MANIFEST": "ktrainer.checkpoint.format",
    "checkpoint_name": "ktrainer.checkpoint.format",
    "FsspecCheckpointIO": "ktrainer.checkpoint.fsspec_io",
    "CheckpointError": "ktrainer.checkpoint.io",
    "CheckpointInfo": "ktrainer.checkpoint.io",
    "CheckpointIO": "ktrainer.checkpoint.io",
    "find_checkpoint": "ktrainer.checkpoint.resume",
})
