"""Gradient arithmetic that keeps sparse gradients sparse.

An Embedding's gradient is an `IndexedSlices` (the rows a batch touched). Python arithmetic on it
(`g / scale`, `g * factor`, `tf.math.is_finite(g)`) makes it a dense tensor of the whole table:
memory, time, and a sparse-aware optimizer step (Adam's lazy rows) turned into a dense one. These
helpers act on its values only; scaling one is `ktrainer.precision.loss_scale.scale_gradient`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["values", "dense"]


def values(gradient: Any) -> tf.Tensor:
    """The numbers a gradient holds (an IndexedSlices' values), for checks such as finiteness."""
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def dense(gradient: Any) -> tf.Tensor:
    """A gradient as a dense tensor (where a sum over replicas or a norm needs one)."""
    return tf.convert_to_tensor(gradient)
