"""Where the values a run computes go: the chief's loggers, `callback_metrics`, and the progress bar's labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ktrainer.loggers import Logger

__all__ = ["Reporter"]

STEP_LOSS = "train/loss_step"


class Reporter:
    """Sends metrics to the loggers (in the chief only) and keeps the latest values for callbacks and the bar.

    Args:
        loggers: The run's loggers.
        is_chief: Whether this process writes (asked at every write: a JAX process learns its rank
            only once `jax.distributed` is up).

    Attributes:
        callback_metrics: The latest value of every metric, under its logged name ("train/loss_step")
            and its plain name ("train/loss"), for callbacks such as EarlyStopping.
        logged_metrics: The latest value of every metric sent to the loggers.
        progress_bar_metrics: What the progress bar shows, by label.
    """

    def __init__(self, loggers: list[Logger], is_chief: Callable[[], bool]) -> None:
        self.loggers = loggers
        self._is_chief = is_chief
        self.callback_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}
        self.progress_bar_metrics: dict[str, float] = {}

    @property
    def writing_loggers(self) -> list[Logger]:
        """The loggers this process writes through: all of them in the chief, none elsewhere."""
        return self.loggers if self._is_chief() else []

    def log(self, metrics: dict[str, float], step: int, epoch: int) -> None:
        """Send metrics to every writing logger, with the epoch, at `step`; keep them for callbacks."""
        self.logged_metrics.update(metrics)
        self.callback_metrics.update(metrics)
        for each in self.writing_loggers:
            each.log_metrics({**metrics, "epoch": epoch}, step)

    def remember(self, values: dict[str, float], shown: set[str]) -> None:
        """Keep values for callbacks (under the logged and the plain names), and those in `shown` for the bar."""
        self.callback_metrics.update(values)
        for name in values:
            plain = name.removesuffix("_step").removesuffix("_epoch")
            self.callback_metrics[plain] = values[name]
        for name in (shown | {STEP_LOSS}) & set(values):
            label = "loss" if name == STEP_LOSS else name
            self.progress_bar_metrics[label] = values[name]

    def log_hyperparameters(self, hparams: dict[str, Any]) -> None:
        """Send the module's hyperparameters to every writing logger (nothing when there are none)."""
        if hparams:
            for each in self.writing_loggers:
                each.log_hyperparams(hparams)

    def flush(self) -> None:
        """Make what was logged so far readable (event files, CSV rows)."""
        for each in self.writing_loggers:
            each.flush()
