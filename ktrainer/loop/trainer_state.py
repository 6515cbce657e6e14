"""Where the loop is inside one call: flags callbacks read between steps (what persists is in Progress)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainerState"]


@dataclass
class TrainerState:
    """The Trainer's position inside the current fit/validate/test/predict call.

    Attributes:
        stage: "fit", "validate", "test", "predict", or "" between calls.
        first_batch_of_epoch: The batch the current epoch started (or resumed) at.
        at_epoch_end: True while the epoch-end validation and hooks run.
        validated_this_epoch: True once the current epoch ran a validation at its end.
        averages_in_weights: The optimizer's moving averages (`use_ema=True`) were put into the weights at
            the end of fit: the model no longer holds the weights training ended with.
        logged_steps: The global steps the last execution logged, each with the optimizer updates applied
            after it (within that execution, and by the executions dispatched after it and still in flight):
            a per-step value such as the learning rate is read back by them.
        planned_saves: For the execution whose batch end runs now, what each ModelCheckpoint (by `id`) decided
            when it was dispatched (a reason, or None: no save); None outside fit's batch ends.
    """

    stage: str = ""
    first_batch_of_epoch: int = 0
    at_epoch_end: bool = False
    validated_this_epoch: bool = False
    averages_in_weights: bool = False
    logged_steps: tuple[tuple[int, int], ...] = ()
    planned_saves: dict[int, str | None] | None = None
