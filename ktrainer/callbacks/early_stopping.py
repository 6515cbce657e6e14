"""Stop training when a monitored metric stops improving."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ktrainer.callbacks.callback import Callback
from ktrainer.checks import check_bool, check_choice, check_int

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["EarlyStopping"]

log = logging.getLogger(__name__)


class EarlyStopping(Callback):
    """Stops `fit` when `monitor` has not improved by `min_delta` for `patience` validations.

    When it checks (Lightning's rule): with the default rhythm (a validation at every epoch's end)
    or no validation, at every epoch's end, once the epoch's training and validation metrics are
    logged; with `val_check_interval` or `check_val_every_n_epoch` other than 1, after each
    validation (never on an old validation's value at an epoch end that did not validate).

    Args:
        monitor: The metric to watch, e.g. "val/loss".
        mode: "min" (lower is better) or "max".
        patience: Checks without improvement before stopping.
        min_delta: The least change that counts as an improvement.
        strict: Raise if `monitor` is not among the metrics when a check happens.
        restore_best_weights: When it stops the run, put back the model's weights of its best
            check (as Keras's EarlyStopping does); a checkpoint keeps them.
        check_on_train_epoch_end: True: check at every epoch's end (a training metric, with validation
            inside epochs); False: after each validation in fit; None: the rule above (as Lightning).

    Raises:
        ValueError: For a bad `mode`, `patience`, `min_delta` or `check_on_train_epoch_end`.
    """

    def __init__(self, monitor: str = "val/loss", mode: str = "min", patience: int = 3,
                 min_delta: float = 0.0, strict: bool = True, restore_best_weights: bool = False,
                 check_on_train_epoch_end: bool | None = None) -> None:
        self.monitor = monitor
        self.mode = check_choice("mode", mode, ("min", "max"))
        self.patience = check_int("patience", patience, minimum=0)
        if min_delta < 0:
            raise ValueError(f"min_delta must be >= 0, got {min_delta}.")
        self.min_delta = float(min_delta)
        self.strict = strict
        self.best = math.inf if mode == "min" else -math.inf
        self.wait = 0
        self.stopped_epoch: int | None = None
        self.restore_best_weights = check_bool("restore_best_weights", restore_best_weights)
        self.best_weights: list[np.ndarray] | None = None
        self.check_on_train_epoch_end = None if check_on_train_epoch_end is None else check_bool(
            "check_on_train_epoch_end", check_on_train_epoch_end)

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """Check after each validation in fit, when validations do not fall once at every epoch's end."""
        if trainer.state.stage == "fit" and not self._checks_at_epoch_ends(trainer):
            self._check(trainer, module)

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Check at every epoch's end, once its validation ran and its metrics are logged, when validations fall
        once at every epoch's end (the default) or the fit has none (then a training metric is monitored)."""
        if self._checks_at_epoch_ends(trainer):
            self._check(trainer, module)

    def _checks_at_epoch_ends(self, trainer: Trainer) -> bool:
        if self.check_on_train_epoch_end is not None:
            return self.check_on_train_epoch_end
        return _checks_at_epoch_ends(trainer)

    def _check(self, trainer: Trainer, module: Module) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            if self.strict:
                known = ", ".join(sorted(trainer.callback_metrics)) or "none yet"
                when = "" if self._checks_at_epoch_ends(trainer) else (
                    " It is checked after each validation (the validation rhythm is not once per epoch); for a "
                    "metric logged at the epoch's end, pass check_on_train_epoch_end=True.")
                raise RuntimeError(
                    f"EarlyStopping(monitor={self.monitor!r}) found no such metric. Logged metrics: "
                    f"{known}. Log it with self.log({self.monitor!r}, ...) or pass strict=False.{when}"
                )
            return
        improved = (value < self.best - self.min_delta) if self.mode == "min" else (
            value > self.best + self.min_delta)
        if improved:
            self.best, self.wait = float(value), 0
            if self.restore_best_weights:
                self.best_weights = [np.array(w, copy=True) for w in module.model.get_weights()]
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = trainer.current_epoch
            trainer.should_stop = True
            trainer.stop_reason = (f"EarlyStopping: {self.monitor} did not improve for {self.wait} checks "
                                   f"(best {self.best:.6g})")
            if self.restore_best_weights and self.best_weights is not None:
                module.model.set_weights(self.best_weights)
                trainer.stop_reason += ", best weights restored"
            log.debug("%s; stopping.", trainer.stop_reason)

    @property
    def state_key(self) -> str:
        """The class, the monitored metric and the mode: two EarlyStopping callbacks keep separate state."""
        return self._state_key_with(monitor=self.monitor, mode=self.mode)

    def state_dict(self) -> dict[str, Any]:
        """Best value, checks waited, the epoch it stopped at, and the best weights when it keeps them."""
        state = {"best": self.best, "wait": self.wait, "stopped_epoch": self.stopped_epoch}
        if self.best_weights is not None:
            state["best_weights"] = self.best_weights
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `best`, `wait` and `stopped_epoch`."""
        self.best = float(state["best"])
        self.wait = int(state["wait"])
        self.stopped_epoch = state.get("stopped_epoch")
        weights = state.get("best_weights")
        self.best_weights = [np.array(w, copy=True) for w in weights] if weights is not None else None


def _checks_at_epoch_ends(trainer: Trainer) -> bool:
    """Lightning's rule: at epoch ends with the default rhythm or no validation; after each validation otherwise
    (at an epoch end with no validation the monitored value would be an old validation's)."""
    schedule = trainer.schedule
    return schedule.validates_once_per_epoch() or not schedule.validates_at_all()
