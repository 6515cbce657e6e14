"""Loss scaling as objects: `DynamicLossScale` for float16, `NoLossScale` elsewhere; backend-neutral (keras.ops).

A step asks the loss scale to scale the loss, unscale the gradients, say whether they are finite
and move itself; with `NoLossScale` each of these does nothing, so no step has an `if precision`
branch. `DynamicLossScale` keeps its state in the `LossScaleOptimizer`'s own variables
(`dynamic_scale`, `step_counter`), so a checkpoint holds them under the same names on every backend.
The arithmetic is stateless (`next_state`), which a jitted JAX step uses directly; `update`
assigns it, which a TensorFlow step uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

__all__ = ["DynamicLossScale", "NoLossScale", "scale_gradient", "all_finite"]


def scale_gradient(gradient: Any, factor: Any) -> Any:
    """`gradient * factor`; a sparse gradient (an IndexedSlices: values, indices, dense_shape) stays sparse."""
    if gradient is None:
        return None
    if hasattr(gradient, "indices") and hasattr(gradient, "dense_shape"):
        values = gradient.values * keras.ops.cast(factor, gradient.values.dtype)
        return type(gradient)(values, gradient.indices, gradient.dense_shape)
    return gradient * keras.ops.cast(factor, gradient.dtype)


def all_finite(gradients: Sequence[Any]) -> Any:
    """A boolean scalar: every number of every gradient (a sparse one's values) is finite."""
    checks = [keras.ops.all(keras.ops.isfinite(getattr(g, "values", g))) for g in gradients if g is not None]
    return keras.ops.all(keras.ops.stack(checks)) if checks else keras.ops.convert_to_tensor(True)


class NoLossScale:
    """No loss scaling: every method is the identity, every step is applied."""

    scaling = False

    def scale(self, loss: Any, scale: Any = None) -> Any:
        """The loss, unchanged."""
        return loss

    def unscale(self, gradients: list, scale: Any = None) -> list:
        """The gradients, unchanged."""
        return gradients

    def value(self) -> Any:
        """None: there is no scale."""
        return None


class DynamicLossScale:
    """A dynamic loss scale: halve and skip on non-finite gradients, double after `growth_interval` finite steps.

    Args:
        optimizer: The `keras.mixed_precision.LossScaleOptimizer` whose `dynamic_scale` and
            `step_counter` variables hold the state (built before the first step).
    """

    scaling = True

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.growth_interval = int(optimizer.dynamic_growth_steps)

    @property
    def variables(self) -> list[Any]:
        """The state: [scale, finite steps since the last change]."""
        return [self.optimizer.dynamic_scale, self.optimizer.step_counter]

    def value(self) -> Any:
        """The current scale (the initial one before the optimizer is built)."""
        return self.optimizer.dynamic_scale if self.optimizer.built else self.optimizer.initial_scale

    def scale(self, loss: Any, scale: Any = None) -> Any:
        """The loss times the scale (the current one, or `scale` in a stateless step)."""
        scale = self.optimizer.dynamic_scale if scale is None else scale
        return loss * keras.ops.cast(scale, loss.dtype)

    def unscale(self, gradients: list, scale: Any = None) -> list:
        """The gradients divided by the scale, once; sparse gradients stay sparse."""
        scale = self.optimizer.dynamic_scale if scale is None else scale
        inverse = 1.0 / keras.ops.cast(scale, "float32")
        return [scale_gradient(g, inverse) for g in gradients]

    def next_state(self, finite: Any, scale: Any, counter: Any) -> tuple[Any, Any]:
        """The (scale, counter) after a step whose gradients were `finite` (or not): stateless arithmetic."""
        grow = keras.ops.logical_and(finite, keras.ops.equal(counter, self.growth_interval - 1))
        zero = keras.ops.zeros_like(counter)
        new_counter = keras.ops.where(finite, keras.ops.where(grow, zero, counter + 1), zero)
        factor = keras.ops.where(finite, keras.ops.where(grow, 2.0, 1.0), 0.5)
        return scale * keras.ops.cast(factor, scale.dtype), new_counter

    def update(self, finite: Any) -> None:
        """Move the scale after a step (assigns the optimizer's variables)."""
        scale, counter = self.next_state(finite, self.optimizer.dynamic_scale.value,
                                         self.optimizer.step_counter.value)
        self.optimizer.step_counter.assign(counter)
        self.optimizer.dynamic_scale.assign(scale)
