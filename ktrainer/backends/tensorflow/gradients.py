"""Gradient arithmetic that keeps sparse gradients sparse, and gives the optimizer each row of one once.

An Embedding's gradient is an `IndexedSlices` with one row per lookup: a token that occurs twice
in a batch gives two rows with the same index, and the sum over replicas concatenates the replicas'
rows. Keras 3's TensorFlow optimizers apply such a gradient row by row, so every non-linear update
(Adam's second moment, Adagrad's and RMSprop's accumulators, ...) adds the squares of the parts
instead of the square of their sum: the update of a different gradient than the loss has.
`sum_duplicate_rows` gives the optimizer the gradient itself, still sparse (an embedding table's
gradient is the rows a batch touched, not the table).

Python arithmetic on an `IndexedSlices` (`g / scale`, `g * factor`, `tf.math.is_finite(g)`) makes it
a dense tensor of the whole table: these helpers act on its values only; scaling one is
`ktrainer.precision.loss_scale.scale_gradient`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["values", "dense", "is_sparse", "sum_duplicate_rows", "nonzero_rows", "replica_share"]


def values(gradient: Any) -> tf.Tensor:
    """The numbers a gradient holds (an IndexedSlices' values), for checks such as finiteness."""
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def dense(gradient: Any) -> tf.Tensor:
    """A gradient as a dense tensor (where a sum over replicas or a norm needs one)."""
    return tf.convert_to_tensor(gradient)


def is_sparse(gradient: Any) -> bool:
    """Whether a gradient is an `IndexedSlices` (rows of its variable)."""
    return isinstance(gradient, tf.IndexedSlices)


def sum_duplicate_rows(gradient: Any) -> Any:
    """A sparse gradient with one row per index, the rows of each index summed; a dense gradient unchanged.

    The rows keep the order of each index's first occurrence, so the same input gives the same
    output on every replica.
    """
    if not is_sparse(gradient):
        return gradient
    unique, position = tf.unique(gradient.indices)
    summed = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(unique)[0])
    return tf.IndexedSlices(summed, unique, gradient.dense_shape)


def nonzero_rows(total: tf.Tensor) -> tf.IndexedSlices:
    """The rows of a dense sum of sparse gradients that hold a nonzero number, as a sparse gradient (one row per
    index): what a gradient-accumulation group's sum of an embedding table's gradients hands on."""
    rank = total.shape.rank
    touched = tf.not_equal(total, 0) if rank == 1 else tf.reduce_any(tf.not_equal(total, 0),
                                                                      axis=list(range(1, rank)))
    rows = tf.reshape(tf.where(touched), [-1])
    return tf.IndexedSlices(tf.gather(total, rows), rows, tf.shape(total, out_type=tf.int64))


def replica_share(gradient: Any, replica: Any, replicas: int) -> Any:
    """This replica's part of a gradient every replica holds whole, such that the optimizer's sum over replicas
    gives that gradient back.

    A sparse gradient's rows are split into `replicas` contiguous parts (the sum over replicas of
    sparse gradients concatenates them): each row reaches the optimizer once. A dense gradient is
    each replica's own, which the optimizer sums: it is returned unchanged.

    Args:
        gradient: A sparse gradient summed over replicas (identical on each), or a replica's dense gradient.
        replica: This replica's index (`replica_id_in_sync_group`).
        replicas: The number of replicas.
    """
    if not is_sparse(gradient) or replicas == 1:
        return gradient
    count = tf.shape(gradient.indices, out_type=tf.int64)[0]
    replica = tf.cast(replica, tf.int64)
    start, end = count * replica // replicas, count * (replica + 1) // replicas
    return tf.IndexedSlices(gradient.values[start:end], gradient.indices[start:end], gradient.dense_shape)
