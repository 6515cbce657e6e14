"""`Trainer.save_checkpoint(path)`: one checkpoint of the full training state where the user says.

The same checkpoint a ModelCheckpoint writes (atomic commit, verified), outside any retention: no
ModelCheckpoint lists or deletes it (its name is not `step-...`), and `ckpt_path=path` resumes from it.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any

from ktrainer.checkpoint.format import step_of
from ktrainer.checkpoint.manager import CheckpointManager
from ktrainer.checkpoint.resume import split_checkpoint_url
from ktrainer.utils.logs import warn_user

if TYPE_CHECKING:
    from ktrainer.trainer import Trainer

__all__ = ["save_checkpoint_at"]

_SAVES = itertools.count(1)  # with the run id, a save id no other save of this process uses


def save_checkpoint_at(trainer: Trainer, filepath: str | os.PathLike,
                       storage_options: dict[str, Any]) -> str | None:
    """Write the training state as one checkpoint at `filepath` (the chief; with a state sharded over several
    processes every process writes its slices, so every process must call it) and wait for the commit.

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
        warn_user("save_checkpoint after fit: the model holds the optimizer's moving averages (use_ema=True, put "
                  "in at the end of fit), so a run resumed from this checkpoint continues from them, not from the "
                  "weights training ended with. For an exact resume, save during fit (from a callback), or use "
                  "the ModelCheckpoint's save_last checkpoint.")
    sharded = trainer.engine.multi_process and trainer.engine.shards_state
    if not trainer.is_global_zero and not sharded:
        return None
    manager = CheckpointManager()  # outside every retention: it keeps what it writes
    manager.open(directory, save_numbers=_SAVES)  # a new id each time: a second save to one path replaces the first
    manager.refuse_what_is_not_this_runs(name, trainer.run.lineage)
    if sharded:  # every process writes its own slices, the chief commits (sharded_save.py)
        url = manager.save(trainer, name, {"reason": "manual"})
        return url if trainer.is_global_zero else None
    return manager.write(trainer, name, {"reason": "manual"}).url
