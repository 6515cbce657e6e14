"""The dynamic loss scale's rule: apply and maybe grow on finite gradients, skip and halve on the others."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = ["apply_or_skip"]


def apply_or_skip(optimizer: Any, apply: Callable[[], None], finite: tf.Tensor) -> tf.Tensor:
    """Run `apply` when `finite`, else skip; update the scale (call in the cross-replica context).

    Uses the LossScaleOptimizer's own `dynamic_scale` and `step_counter` variables, so that a
    checkpoint of the optimizer holds them. A skipped step leaves weights, optimizer slots and the
    iteration count untouched and halves the scale; `dynamic_growth_steps` finite steps in a row
    double it. `finite` is one decision for all replicas (Keras's own LossScaleOptimizer, under
    MirroredStrategy, looks at the first replica's gradients only).

    Returns:
        1.0 if the step was skipped, else 0.0.
    """

    def step():
        apply()
        grow = tf.equal(optimizer.step_counter, optimizer.dynamic_growth_steps - 1)
        optimizer.step_counter.assign(tf.where(grow, tf.zeros_like(optimizer.step_counter),
                                               optimizer.step_counter + 1))
        optimizer.dynamic_scale.assign(tf.where(grow, optimizer.dynamic_scale * 2.0, optimizer.dynamic_scale))
        return tf.constant(0.0)

    def skip():
        optimizer.step_counter.assign(tf.zeros_like(optimizer.step_counter))
        optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 0.5)
        return tf.constant(1.0)

    return tf.cond(finite, step, skip)
