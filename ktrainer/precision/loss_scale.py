"""Dynamic loss scaling inside the Trainer's own step: scale, unscale once, skip non-finite steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = ["skip_or_apply", "all_finite_on_every_replica"]


def all_finite_on_every_replica(gradients: list) -> tf.Tensor:
    """True when every gradient is finite on every replica (the decision is the same everywhere).

    Keras's LossScaleOptimizer under MirroredStrategy looks at one replica only; here the count
    of non-finite gradients is summed across replicas, so one bad replica skips the step on all.
    """
    flags = [tf.reduce_all(tf.math.is_finite(g)) for g in gradients if g is not None]
    bad = tf.cast(tf.logical_not(tf.reduce_all(tf.stack(flags))), tf.float32)
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        bad = context.all_reduce(tf.distribute.ReduceOp.SUM, bad)
    return tf.equal(bad, 0.0)


def skip_or_apply(optimizer: Any, update: Callable[[Any, list], None], gradients: list) -> tf.Tensor:
    """Apply `update` with finite gradients, else skip the step; adjust the dynamic scale either way.

    Uses the LossScaleOptimizer's own `dynamic_scale` and `step_counter` variables (so a checkpoint
    of the optimizer holds them), but steps its inner optimizer: the gradients are already unscaled.
    A skipped step leaves weights, optimizer slots and the iteration count untouched and halves the
    scale; `dynamic_growth_steps` finite steps in a row double it.

    Returns:
        1.0 if the step was skipped, else 0.0.
    """
    finite = all_finite_on_every_replica(gradients)

    def step():
        update(optimizer.inner_optimizer, gradients)
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
