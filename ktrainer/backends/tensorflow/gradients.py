"""Gradient arithmetic that keeps sparse gradients sparse.

An Embedding's gradient is an `IndexedSlices` (the rows a batch touched). Python arithmetic on it
(`g / scale`, `g * factor`, `tf.math.is_finite(g)`) makes it a dense tensor of the whole table:
memory, time, and a sparse-aware optimizer step (Adam's lazy rows) turned into a dense one. These
helpers act on its values only.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["scale", "values", "dense"]


def scale(gradient: Any, factor: Any) -> Any:
    """`gradient * factor`, an IndexedSlices staying one."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        factor = tf.cast(factor, gradient.values.dtype)
        return tf.IndexedSlices(gradient.values * factor, gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def values(gradient: Any) -> tf.Tensor:
    """The numbers a gradient holds (an IndexedSlices' values), for checks such as finiteness."""
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def dense(gradient: Any) -> tf.Tensor:
    """A gradient as a dense tensor (where a sum over replicas or a norm needs one)."""
    return tf.convert_to_tensor(gradient)
