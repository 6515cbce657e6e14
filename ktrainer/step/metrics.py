"""Turns the per-step values of the compiled steps into step metrics and exact epoch means."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from ktrainer.module import LogOptions, module_runtime
from ktrainer.progress import RunningSums
from ktrainer.step.outputs import APPLIED, BATCH_SIZE, CLOCK, SKIPPED, STOP

__all__ = ["EpochMetrics", "metric_names", "metric_objects", "metric_object_values", "reset_metric_objects",
           "hook_values"]

_PRIVATE = (BATCH_SIZE, APPLIED, SKIPPED, STOP, CLOCK)


def metric_names(name: str, options: LogOptions) -> tuple[str | None, str | None]:
    """The names a value is logged under per step and per epoch (None where it is not logged).

    With both `on_step` and `on_epoch`, they are `name_step` and `name_epoch`; otherwise `name`.
    """
    if options.on_step and options.on_epoch:
        return f"{name}_step", f"{name}_epoch"
    return (name if options.on_step else None), (name if options.on_epoch else None)


class EpochMetrics:
    """Names and means of one epoch (or one evaluation) of per-step values.

    Epoch values are means over the examples seen: each step's value is weighted by its
    batch size, so a smaller last batch counts for what it is. The sums themselves live in a
    `RunningSums` (for training, the one `Progress` owns, so a checkpoint holds them).

    Args:
        options: The LogOptions of every logged name, as recorded by `Module.log`.
        sums: The running sums to add to; default: fresh ones.
    """

    def __init__(self, options: dict[str, LogOptions], sums: RunningSums | None = None) -> None:
        self.options = options
        self.sums = sums if sums is not None else RunningSums()
        self._shown: set[str] | None = None

    @property
    def steps(self) -> int:
        """Steps added so far."""
        return self.sums.steps

    def add(self, outputs: dict[str, np.ndarray]) -> None:
        """Add the per-step values of one execution."""
        values = {name: v for name, v in outputs.items() if name not in _PRIVATE}
        self.sums.add(values, outputs[BATCH_SIZE])

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
        metrics = {}
        for name, mean in self.sums.means().items():
            _, epoch_name = metric_names(name, self.options[name])
            if epoch_name is not None:
                metrics[epoch_name] = mean
        return metrics

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


def metric_object_values(module: Any, stage: str, *, epoch: bool) -> dict[str, float]:
    """The results of the Keras metric objects `module` logged in `stage`, under their step or epoch names.

    Read in Python, between compiled calls: under a distribution strategy this is the
    cross-replica result, exact over every replica.

    Raises:
        ValueError: For a metric whose result is not a scalar.
    """
    values = {}
    for name, metric in metric_objects(module, stage).items():
        step_name, epoch_name = metric_names(name, module_runtime(module).log_options[name])
        logged = epoch_name if epoch else step_name
        if logged is None:
            continue
        result = np.asarray(keras.ops.convert_to_numpy(metric.result()))
        if result.size != 1:
            raise ValueError(
                f"self.log({name!r}, {type(metric).__name__}(...)): its result has shape {result.shape}; logged "
                "values must be scalars. Log one entry of it, or a metric that averages it."
            )
        values[logged] = float(result.reshape(()))
    return values


def metric_objects(module: Any, stage: str) -> dict[str, Any]:
    """The Keras metric objects `module` logged in `stage` ("train", "val", "test"), by logged name."""
    return module_runtime(module).metric_objects.get(stage, {})


def reset_metric_objects(module: Any, stage: str) -> None:
    """Reset the Keras metric objects `module` logged in `stage` (at the start of an epoch or evaluation)."""
    for metric in metric_objects(module, stage).values():
        metric.reset_state()


def hook_values(logged: dict[str, Any]) -> dict[str, float]:
    """Values logged from a Python hook (numbers, eager tensors), as floats.

    Raises:
        ValueError: For a value that is not a scalar.
    """
    values = {}
    for name, value in logged.items():
        array = np.asarray(keras.ops.convert_to_numpy(value))
        if array.size != 1:
            raise ValueError(f"self.log({name!r}, ...) got a value of shape {array.shape}; logged values must be "
                             "scalars.")
        values[name] = float(array.reshape(()))
    return values
