"""Log the optimizer's learning rate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras

from ktrainer.callbacks.callback import Callback
from ktrainer.checks import check_choice
from ktrainer.compat.keras_internals import learning_rate_as_set

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["LearningRateMonitor", "current_learning_rate"]


def current_learning_rate(optimizer: Any, updates_ago: int = 0) -> float:
    """The learning rate the optimizer applies at its current iteration (schedules evaluated), or at the
    iteration it had `updates_ago` updates before."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    rate = learning_rate_as_set(inner)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        iteration = inner.iterations
        rate = rate(iteration if updates_ago == 0 else keras.ops.convert_to_numpy(iteration) - updates_ago)
    return float(keras.ops.convert_to_numpy(rate))


class LearningRateMonitor(Callback):
    """Logs the learning rate as `lr-{OptimizerClass}` to every logger (`lr-Adam`, `lr-Adam-1`, ... with several).

    The Trainer adds one (logging at each log step) when it has a logger and none was given.

    Args:
        logging_interval: "step" (at the Trainer's log steps) or "epoch" (at epoch ends).

    Raises:
        ValueError: For another `logging_interval`.
    """

    def __init__(self, logging_interval: str = "step") -> None:
        self.logging_interval = check_choice("logging_interval", logging_interval, ("step", "epoch"))

    def on_train_batch_end(self, trainer: Trainer, module: Module, metrics: dict[str, float], batch_idx: int) -> None:
        """Log at every log step this execution passed, each with that step's rate (as one batch per execution
        would: with `steps_per_execution` > 1 a schedule's rate changes within an execution)."""
        logged = trainer.state.logged_steps
        if self.logging_interval != "step" or not logged:
            return
        if not module.automatic_optimization:  # each optimizer counts its own updates: only the current rates are known
            logged = ((logged[-1][0], 0),)
        trainer.engine.sync()  # on JAX the optimizer's variables are stale while its state is live
        for step, updates_after in logged:
            trainer.log_metrics(self._rates(trainer, updates_after), step=step)

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Log at each epoch start, with interval "epoch"."""
        if self.logging_interval == "epoch":
            self._log(trainer)

    def _log(self, trainer: Trainer) -> None:
        trainer.engine.sync()  # on JAX the optimizer's variables are stale while its state is live
        trainer.log_metrics(self._rates(trainer, 0))

    @staticmethod
    def _rates(trainer: Trainer, updates_ago: int) -> dict[str, float]:
        rates, seen = {}, {}
        for optimizer in trainer.optimizers:
            inner = getattr(optimizer, "inner_optimizer", optimizer)
            kind = type(inner).__name__
            seen[kind] = seen.get(kind, 0) + 1
            name = f"lr-{kind}" if seen[kind] == 1 else f"lr-{kind}-{seen[kind] - 1}"
            rates[name] = current_learning_rate(optimizer, updates_ago)
        return rates
