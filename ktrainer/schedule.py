"""When the training loop validates, logs and stops: decisions from the Trainer's arguments and the progress.

The loop in `trainer.py` only asks; every rule about intervals, limits and execution sizes lives here, in
plain Python over plain numbers, so each is tested on its own (tests/test_schedule.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ktrainer.progress import Progress

__all__ = ["Schedule"]


@dataclass(frozen=True)
class Schedule:
    """The decisions of one `fit`.

    Attributes:
        max_epochs: Stop after this many epochs (None: no limit).
        max_steps: Stop after this many optimizer steps (None: no limit).
        batches_per_epoch: Training batches per epoch; None when the data's length is unknown.
        steps_per_execution: Batches per compiled call, at most.
        accumulate_grad_batches: Batches per optimizer step.
        val_check_interval: Validate every N batches (int) or every fraction of an epoch (float); None: at
            epoch ends only.
        check_val_every_n_epoch: Validate at every N-th epoch end; None: not at epoch ends.
        log_every_n_steps: Log step metrics every N optimizer steps.
        whole_groups: End every execution at an accumulation group's boundary (several processes: a
            checkpoint there needs no other process's partial sums).
    """

    max_epochs: int | None
    max_steps: int | None
    batches_per_epoch: int | None
    steps_per_execution: int = 1
    accumulate_grad_batches: int = 1
    val_check_interval: int | float | None = None
    check_val_every_n_epoch: int | None = 1
    log_every_n_steps: int = 50
    whole_groups: bool = False

    def finished(self, progress: Progress) -> bool:
        """Whether a limit is reached (a callback's `should_stop` is the Trainer's own)."""
        if self.max_steps is not None and progress.global_step >= self.max_steps:
            return True
        return self.max_epochs is not None and progress.epoch >= self.max_epochs

    def batches_in_next_execution(self, progress: Progress) -> int:
        """Batches the next compiled call may run: `steps_per_execution`, cut at the epoch's end, at `max_steps`,
        at the next validation and (with `whole_groups`) at the next group boundary; 0 when none is left."""
        batch = progress.batch_in_epoch
        accumulate = self.accumulate_grad_batches
        steps = self.steps_per_execution
        if self.batches_per_epoch is not None:
            steps = min(steps, self.batches_per_epoch - batch)
        if self.max_steps is not None:
            steps = min(steps, (self.max_steps - progress.global_step) * accumulate - batch % accumulate)
        interval = self.val_interval_batches()
        if interval is not None:
            steps = min(steps, interval - batch % interval)
        if self.whole_groups and accumulate > 1:
            steps = min(steps, accumulate - batch % accumulate)
        return max(steps, 0)

    def val_interval_batches(self) -> int | None:
        """Validate every this many batches within an epoch; None: at epoch ends only."""
        interval = self.val_check_interval
        if interval is None or (isinstance(interval, float) and interval == 1.0):
            return None
        if isinstance(interval, int):
            return interval
        return max(1, int(self.batches_per_epoch * interval))

    def validates_within_epoch(self, progress: Progress) -> bool:
        """Whether the batches run so far end at a validation inside the epoch (not at its last batch)."""
        interval = self.val_interval_batches()
        batch = progress.batch_in_epoch
        if interval is None or batch % interval:
            return False
        return self.batches_per_epoch is None or batch < self.batches_per_epoch

    def validates_at_epoch_end(self, progress: Progress) -> bool:
        """Whether the current epoch's end validates."""
        if self.val_interval_batches() is not None:
            return True
        every = self.check_val_every_n_epoch
        return every is not None and (progress.epoch + 1) % every == 0

    def log_indices(self, stepped: Sequence[bool], steps_after: Sequence[int]) -> list[int]:
        """Of one execution's batches, those that end at a log step: an optimizer step taken, at a multiple
        of `log_every_n_steps` (`stepped`: whether each batch ended a step; `steps_after`: the step count then)."""
        every = self.log_every_n_steps
        return [index for index, (ended, step) in enumerate(zip(stepped, steps_after, strict=True))
                if ended and step % every == 0]
