"""Where a run stands: what callbacks and the progress bar read between steps."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainerState"]


@dataclass
class TrainerState:
    """The Trainer's position inside the current fit/validate/test/predict call.

    Attributes:
        stage: "fit", "validate", "test", "predict", or "" between calls.
        batch_in_epoch: Training batches consumed in the current epoch.
        first_batch_of_epoch: The batch the current epoch started (or resumed) at.
        at_epoch_end: True while the epoch-end validation and hooks run.
        validated_this_epoch: True once the current epoch ran a validation at its end.
        epoch_ended: True once the current epoch's data is consumed (not stopped early by max_steps).
        logged_step_in_last_execution: True when the last execution reached a log step.
    """

    stage: str = ""
    batch_in_epoch: int = 0
    first_batch_of_epoch: int = 0
    at_epoch_end: bool = False
    validated_this_epoch: bool = False
    epoch_ended: bool = False
    logged_step_in_last_execution: bool = False
