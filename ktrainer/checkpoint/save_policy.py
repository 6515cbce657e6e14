"""When to save: pure decisions over a run's position and clock, tested without any storage.

A ModelCheckpoint asks here whether a batch end or an epoch end saves; *what* a save is lives in
`manager.py`, what to keep in `retention.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SavePolicy", "should_save"]


@dataclass(frozen=True)
class SavePolicy:
    """The save triggers of one ModelCheckpoint.

    Attributes:
        every_n_train_steps: Save every N optimizer steps (None: no step trigger).
        every_n_epochs: Save every N epochs (None: no epoch trigger).
        train_time_interval: Save when this many seconds passed since the last save (None: no time trigger).
    """

    every_n_train_steps: int | None = None
    every_n_epochs: int | None = None
    train_time_interval: float | None = None

    def epoch_due(self, finished_epoch: int) -> bool:
        """Whether the end of epoch `finished_epoch` (0-based) saves."""
        return self.every_n_epochs is not None and (finished_epoch + 1) % self.every_n_epochs == 0


def should_save(policy: SavePolicy, *, global_step: int, last_saved_step: int, now: float,
                last_saved_time: float) -> str | None:
    """Why a batch end at `global_step` saves ("step", "time"), or None.

    Args:
        policy: The triggers.
        global_step: The optimizer steps taken.
        last_saved_step: The step of the last save (-1 before the first).
        now: The run's clock.
        last_saved_time: The run's clock at the last save (or at the start).
    """
    every = policy.every_n_train_steps
    if every is not None and global_step // every > max(last_saved_step, 0) // every:
        return "step"
    interval = policy.train_time_interval
    if interval is not None and now - last_saved_time >= interval:
        return "time"
    return None
