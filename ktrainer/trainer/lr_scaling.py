"""Learning-rate scaling with the replica count: none, square root or linear."""

from __future__ import annotations

import math
from typing import Any

import keras

from ktrainer.compat.keras_internals import learning_rate_as_set, tensorflow_left_alone

__all__ = ["scale_learning_rate", "ScaledSchedule", "LR_SCALINGS"]

LR_SCALINGS = (None, "sqrt", "linear")


@keras.saving.register_keras_serializable(package="ktrainer")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning-rate schedule multiplied by a constant factor.

    Args:
        schedule: The user's schedule.
        factor: The multiplier.
    """

    def __init__(self, schedule: keras.optimizers.schedules.LearningRateSchedule, factor: float) -> None:
        self.schedule = schedule
        self.factor = float(factor)

    def __call__(self, step: Any) -> Any:
        """The scaled rate at `step`."""
        return self.schedule(step) * self.factor

    def get_config(self) -> dict:
        """Serializable config."""
        with tensorflow_left_alone():
            return {"schedule": keras.saving.serialize_keras_object(self.schedule), "factor": self.factor}

    @classmethod
    def from_config(cls, config: dict) -> ScaledSchedule:
        """Rebuild from `get_config`."""
        with tensorflow_left_alone():
            return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["factor"])


def scale_learning_rate(optimizer: Any, scaling: str | None, replicas: int) -> float:
    """Multiply the optimizer's learning rate (a float, a schedule or a function) for `replicas` replicas.

    The factor is remembered on the optimizer: an optimizer a module returns again on a second fit
    is scaled from its own rate, not scaled twice.

    Args:
        optimizer: The optimizer (a LossScaleOptimizer's inner optimizer is scaled).
        scaling: None (no change), "sqrt" (x sqrt(replicas)) or "linear" (x replicas).
        replicas: Replicas in sync, all workers included.

    Returns:
        The factor applied.
    """
    factor = {None: 1.0, "sqrt": math.sqrt(replicas), "linear": float(replicas)}[scaling]
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    previous = getattr(inner, _APPLIED, 1.0)
    if factor == previous:
        return factor
    rate = _unscaled(learning_rate_as_set(inner), previous)
    if factor == 1.0:
        inner.learning_rate = rate
    elif isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        inner.learning_rate = ScaledSchedule(rate, factor)
    elif callable(rate):
        inner.learning_rate = _ScaledFunction(rate, factor)
    else:
        inner.learning_rate = rate * factor
    setattr(inner, _APPLIED, factor)
    return factor


def _unscaled(rate: Any, factor: float) -> Any:
    """The rate before an earlier scaling by `factor` (1.0: never scaled); a float rate as a Python float."""
    if factor != 1.0 and isinstance(rate, ScaledSchedule):
        return rate.schedule
    if factor != 1.0 and isinstance(rate, _ScaledFunction):
        return rate.function
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or callable(rate):
        return rate
    return float(keras.ops.convert_to_numpy(rate)) / factor


_APPLIED = "_ktrainer_lr_factor"


class _ScaledFunction:
    """A learning rate given as a function of no arguments (Keras allows it), multiplied by a factor."""

    def __init__(self, function: Any, factor: float) -> None:
        self.function, self.factor = function, float(factor)

    def __call__(self) -> Any:
        return self.function() * self.factor
