"""`Trainer.save_checkpoint(path)`: one checkpoint of the full training state where the user says.

The same checkpoint a ModelCheckpoint writes (atomic commit, verified), outside any retention: no
ModelCheckpoint lists or deletes it (its name is not `step-...`), and `ckpt_path=path` resumes from it.
"""

from __future__ import annotations

import itertools
import os
import warnings
from typing import Any

from ktrainer.checkpoint.format import is_own_file, step_of
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
        RuntimeError: Before the model and optimizer are built (`Trainer.save_checkpoint` says so first).
        ValueError: For a name a ModelCheckpoint uses (`step-...`: its retention would own it).
        CheckpointError: When `filepath` holds a checkpoint of another run (never overwritten), a folder of
            checkpoints or of other files, or a file, or the write fails (nothing committed then).
    """
    directory, name = split_checkpoint_url(os.fspath(filepath), storage_options)
    if step_of(name) is not None:
        raise ValueError(f"save_checkpoint({os.fspath(filepath)!r}): names like {name!r} are a ModelCheckpoint's, "
                         "whose retention would manage this one. Pass another name, e.g. 'final', or call "
                         "save_checkpoint() without a path to save through the ModelCheckpoints.")
    if trainer.state.averages_in_weights:
        warnings.warn("save_checkpoint after fit: the model holds the optimizer's moving averages (use_ema=True, put "
                      "in at the end of fit), so a run resumed from this checkpoint continues from them, not from the "
                      "weights training ended with. For an exact resume, save during fit (from a callback), or use "
                      "the ModelCheckpoint's save_last checkpoint.", UserWarning, stacklevel=3)
    if not trainer.is_global_zero:
        return None
    io, run = FsspecCheckpointIO(directory), trainer.run
    _refuse_what_is_not_this_runs(io, directory.join(name), name, run)
    save_id = f"{run.run_id}-{next(_SAVES)}"  # a new one each time: a second save to one path replaces the first
    files, fields = checkpoint_payload(trainer.state_dict(), module.model, run, save_id, {"reason": "manual"})
    return io.write(name, files, fields).url


def _refuse_what_is_not_this_runs(io: FsspecCheckpointIO, target: Any, name: str, run: Any) -> None:
    """Replace only a checkpoint of this run (or one it continues): never another run's, nor a folder of other files."""
    [info] = io.list(names=[name])
    if info.manifest is not None:
        owner = info.fields.get("run_id")
        if owner is not None and owner not in run.lineage:
            raise CheckpointError(
                f"{info.url} holds a checkpoint of another run (run {owner}, step {info.step}); ktrainer does not "
                "overwrite it. Save to another path, or delete it first if it is no longer wanted.")
        return
    if target.fs.isfile(target.path):
        raise CheckpointError(f"{info.url} is a file; a checkpoint is a folder. Pass a new path (it need not exist).")
    held = [child for child in target.children() if not is_own_file(child)]
    if held:
        raise CheckpointError(
            f"{info.url} is a folder holding what is not this checkpoint's ({', '.join(map(repr, held[:3]))}"
            f"{', ...' if len(held) > 3 else ''}): ktrainer writes a checkpoint only into a new or empty folder, "
            "or over a checkpoint of this run. Pass a new path, e.g. a subfolder.")
