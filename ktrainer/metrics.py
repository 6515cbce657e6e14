"""Turns the per-step values of the compiled steps into step metrics and exact epoch means."""

from __future__ import annotations

import numpy as np

from ktrainer.module import LogOptions
from ktrainer.step import APPLIED, BATCH_SIZE, SKIPPED

__all__ = ["EpochMetrics", "metric_names"]

_PRIVATE = (BATCH_SIZE, APPLIED, SKIPPED)


def metric_names(name: str, options: LogOptions) -> tuple[str | None, str | None]:
    """The names a value is logged under per step and per epoch (None where it is not logged).

    With both `on_step` and `on_epoch`, they are `name_step` and `name_epoch`; otherwise `name`.
    """
    if options.on_step and options.on_epoch:
        return f"{name}_step", f"{name}_epoch"
    return (name if options.on_step else None), (name if options.on_epoch else None)


class EpochMetrics:
    """Accumulates one epoch (or one evaluation) of per-step values.

    Epoch values are means over the examples seen: each step's value is weighted by its
    batch size, so a smaller last batch counts for what it is.

    Args:
        options: The LogOptions of every logged name, as recorded by `Module.log`.
    """

    def __init__(self, options: dict[str, LogOptions]) -> None:
        self.options = options
        self._sums: dict[str, float] = {}
        self._examples = 0.0
        self._shown: set[str] | None = None
        self.steps = 0

    def add(self, outputs: dict[str, np.ndarray]) -> None:
        """Add the per-step values of one execution."""
        sizes = outputs[BATCH_SIZE].astype(np.float64)
        self.steps += len(sizes)
        self._examples += float(sizes.sum())
        for name, values in outputs.items():
            if name in _PRIVATE:
                continue
            weighted = float(np.dot(values.astype(np.float64), sizes))
            self._sums[name] = self._sums.get(name, 0.0) + weighted

    def step_metrics(self, outputs: dict[str, np.ndarray], index: int) -> dict[str, float]:
        """The step metrics of step `index` of one execution, under their logged names."""
        metrics = {}
        for name, values in outputs.items():
            if name in _PRIVATE:
                continue
            step_name, _ = metric_names(name, self.options[name])
            if step_name is not None:
                metrics[step_name] = float(values[index])
        return metrics

    def epoch_metrics(self) -> dict[str, float]:
        """The epoch means so far, under their logged names (empty before any step)."""
        if self._examples == 0:
            return {}
        metrics = {}
        for name, total in self._sums.items():
            _, epoch_name = metric_names(name, self.options[name])
            if epoch_name is not None:
                metrics[epoch_name] = total / self._examples
        return metrics

    def state_dict(self) -> dict:
        """The running sums (for a checkpoint taken mid-epoch)."""
        return {"sums": dict(self._sums), "examples": self._examples, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict`'s sums."""
        self._sums = dict(state["sums"])
        self._examples = float(state["examples"])
        self.steps = int(state["steps"])

    def prog_bar_names(self) -> set[str]:
        """Names, as logged per step, of the values shown in the progress bar."""
        if self._shown is None:
            self._shown = self._find_prog_bar_names()
        return self._shown

    def _find_prog_bar_names(self) -> set[str]:
        shown = set()
        for name, options in self.options.items():
            if options.prog_bar:
                step_name, epoch_name = metric_names(name, options)
                shown.add(step_name or epoch_name)
        return shown
