"""`Trainer.save_checkpoint(path)`: one checkpoint of the full training state where the user says.

The same checkpoint a ModelCheckpoint writes (atomic commit, verified), outside any retention: no
ModelCheckpoint lists or deletes it (its name is not `step-...`), and `ckpt_path=path` resumes from it.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError
from ktrainer.checkpoint.payload import checkpoint_payload
from ktrainer.checkpoint.resume import split_checkpoint_url

__all__ = ["save_checkpoint_at"]

_SAVES = itertools.count(1)  # with the run id, a save id no other save of this process uses


def save_checkpoint_at(trainer: Any, module: Any, filepath: str | os.PathLike,
                       storage_options: dict[str, Any]) -> str | None:
    """Write the training state as one checkpoint at `filepath` (chief only) and wait for the commit.

    Returns:
        Its URL; None outside the chief process.

    Raises:
        RuntimeError: Before the model and optimizer are built.
        CheckpointError: When `filepath` holds a checkpoint of another run (never overwritten), a file, or
            the write fails (nothing committed then).
    """
    state = trainer.state_dict()  # first: refuses an unbuilt trainer before anything is written
    if not trainer.is_global_zero:
        return None
    directory, name = split_checkpoint_url(os.fspath(filepath), storage_options)
    io = FsspecCheckpointIO(directory)
    _refuse_another_runs_checkpoint(io, name, trainer.run)
    run = trainer.run
    save_id = f"{run.run_id}-{next(_SAVES)}"  # a new one each time: a second save to one path replaces the first
    files, fields = checkpoint_payload(state, module.model, run, save_id, {"reason": "manual"})
    return io.write(name, files, fields).url


def _refuse_another_runs_checkpoint(io: FsspecCheckpointIO, name: str, run: Any) -> None:
    [info] = io.list(names=[name])
    owner = info.fields.get("run_id") if info.manifest is not None else None
    if owner is not None and owner not in run.lineage:
        raise CheckpointError(
            f"{info.url} holds a checkpoint of another run (run {owner}, step {info.step}); ktrainer does not "
            "overwrite it. Save to another path, or delete it first if it is no longer wanted.")
