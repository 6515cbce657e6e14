"""When the training loop validates, logs and stops: decisions from the Trainer's arguments and the progress.

The loop in `trainer.py` only asks; every rule about intervals, limits and execution sizes lives here, in
plain Python over plain numbers, so each is tested on its own (tests/test_schedule.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ktrainer.progress import Progress

__all__ = ["Schedule", "check_validation_rhythm"]


def check_validation_rhythm(val_check_interval: int | float | None, check_val_every_n_epoch: int | None,
                            limit_val_batches: int | float = 1.0) -> None:
    """Refuse `check_val_every_n_epoch=None` without an int `val_check_interval` (Lightning's rule): it validates
    only every `val_check_interval` batches of the run, so without one fit would never validate.

    Raises:
        ValueError: Naming what to pass instead.
    """
    if check_val_every_n_epoch is not None or limit_val_batches == 0 or isinstance(val_check_interval, int):
        return
    raise ValueError(
        "check_val_every_n_epoch=None validates only every val_check_interval training batches of the run, "
        f"counted across epochs, so val_check_interval must be an int; got {val_check_interval!r}. Give "
        "val_check_interval=N, or keep check_val_every_n_epoch (1: every epoch) for a fraction of an epoch, or "
        "turn validation off with limit_val_batches=0.")


@dataclass(frozen=True)
class Schedule:
    """The decisions of one `fit`.

    Attributes:
        max_epochs: Stop after this many epochs (None: no limit).
        max_steps: Stop after this many optimizer steps (None: no limit).
        batches_per_epoch: Training batches per epoch; None when the data's length is unknown.
        steps_per_execution: Batches per compiled call, at most.
        accumulate_grad_batches: Batches per optimizer step.
        val_check_interval: Validate every N batches (int) or every fraction of an epoch (float), and at
            the epoch's end; None: at epoch ends only.
        check_val_every_n_epoch: Validate only in every N-th epoch (at its end, and at its
            `val_check_interval` batches). None: not at epoch ends, only every `val_check_interval` batches
            (an int) counted over the whole run, across epochs. Both None: the fit does not validate.
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
        if interval is not None and self.validates_in_epoch(progress.epoch):
            steps = min(steps, interval - self._batches_counted(progress) % interval)
        if self.whole_groups and accumulate > 1:
            steps = min(steps, accumulate - batch % accumulate)
        return max(steps, 0)

    def batches_after(self, progress: Progress, num_steps: int) -> int:
        """The batches the call after one of `num_steps` will take in this epoch (what an engine may read while
        that call runs): `batches_in_next_execution` where that call leaves the run, if none of its steps is
        skipped; 0 where it ends the epoch or reaches `max_steps`."""
        return self.batches_in_next_execution(self.progress_after(progress, num_steps))

    def progress_after(self, progress: Progress, num_steps: int) -> Progress:
        """Where a call of `num_steps` batches leaves `progress` if it runs them all (what the loop plans the
        next call from before this one's outputs are read): the group ends it passes are its optimizer steps."""
        accumulate = self.accumulate_grad_batches
        return replace(progress, global_step=progress.global_step + (progress.batch_in_epoch % accumulate
                                                                     + num_steps) // accumulate,
                       batch_in_epoch=progress.batch_in_epoch + num_steps,
                       batches_trained=progress.batches_trained + num_steps)

    def val_interval_batches(self) -> int | None:
        """Validate every this many batches (of the epoch, or of the run: see `check_val_every_n_epoch`);
        None: at epoch ends only."""
        interval = self.val_check_interval
        if interval is None or (isinstance(interval, float) and interval == 1.0):
            return None
        if isinstance(interval, int):
            return interval
        return max(1, int(self.batches_per_epoch * interval))

    def validates_in_epoch(self, epoch: int) -> bool:
        """Whether the epoch (0-based) validates at all: every `check_val_every_n_epoch`-th one, as in Lightning
        (its `val_check_interval` validations included); with None, every epoch."""
        every = self.check_val_every_n_epoch
        return every is None or (epoch + 1) % every == 0

    def validates_at_all(self) -> bool:
        """Whether this fit validates."""
        return self.check_val_every_n_epoch is not None or self.val_interval_batches() is not None

    def validates_once_per_epoch(self) -> bool:
        """Whether validations fall once at every epoch's end and nowhere else (the default rhythm): then a check
        of what they measured (EarlyStopping) belongs at the epoch's end, else after each validation."""
        return self.check_val_every_n_epoch == 1 and self.val_interval_batches() is None

    def validates_within_epoch(self, progress: Progress) -> bool:
        """Whether the batches run so far end at a validation inside the epoch (not at its last batch)."""
        interval = self.val_interval_batches()
        if interval is None or not self.validates_in_epoch(progress.epoch):
            return False
        if self._batches_counted(progress) % interval:
            return False
        return self.batches_per_epoch is None or progress.batch_in_epoch < self.batches_per_epoch

    def validates_at_epoch_end(self, progress: Progress) -> bool:
        """Whether the current epoch's end validates: in a validating epoch, always; with
        `check_val_every_n_epoch=None`, only where the run's count of batches reaches a `val_check_interval`."""
        if self.check_val_every_n_epoch is not None:
            return self.validates_in_epoch(progress.epoch)
        interval = self.val_interval_batches()
        return interval is not None and self._batches_counted(progress) % interval == 0

    def _batches_counted(self, progress: Progress) -> int:
        """The count an interval runs on: the epoch's batches; with `check_val_every_n_epoch=None` and an int
        `val_check_interval`, the run's, so validations keep their rhythm across epochs (Lightning's rule)."""
        whole_run = self.check_val_every_n_epoch is None and isinstance(self.val_check_interval, int)
        return progress.batches_trained if whole_run else progress.batch_in_epoch

    def check_validation(self) -> None:
        """Refuse a validation rhythm that cannot run as asked (at fit, once the epoch's length is known).

        Raises:
            ValueError: A fraction of an epoch whose length is unknown, or a count of batches beyond the
                epoch's end (it would never validate inside an epoch), naming what to pass instead.
        """
        interval = self.val_check_interval
        if isinstance(interval, float) and interval < 1.0 and self.batches_per_epoch is None:
            raise ValueError(
                f"val_check_interval={interval} is a fraction of an epoch, and the number of batches in an epoch of "
                "this training data is not known in advance (an iterable, a tf.data dataset or a PyDataset without "
                "a length). Give an int: validate every N training batches.")
        if (isinstance(interval, int) and self.check_val_every_n_epoch is not None
                and self.batches_per_epoch is not None and interval > self.batches_per_epoch):
            raise ValueError(
                f"val_check_interval={interval} is more than the {self.batches_per_epoch} training batches of an "
                "epoch, so it would never validate inside an epoch. Give at most "
                f"{self.batches_per_epoch} (or a fraction of the epoch, e.g. 0.5), or pass "
                "check_val_every_n_epoch=None to count batches over the whole run, across epochs.")

    def log_indices(self, stepped: Sequence[bool], steps_after: Sequence[int]) -> list[int]:
        """Of one execution's batches, those that end at a log step: an optimizer step taken, at a multiple
        of `log_every_n_steps` (`stepped`: whether each batch ended a step; `steps_after`: the step count then)."""
        every = self.log_every_n_steps
        return [index for index, (ended, step) in enumerate(zip(stepped, steps_after, strict=True))
                if ended and step % every == 0]
