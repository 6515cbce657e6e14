"""One meaning for the loss a step returns: the mean over the replica's batch, however it was computed."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from keras.src.losses import loss as keras_loss_module

__all__ = ["per_replica_mean_losses"]

_lock = threading.Lock()
_depth = 0
_original = keras_loss_module.scale_loss_for_distribution


def _unscaled(value):
    return value


@contextlib.contextmanager
def per_replica_mean_losses() -> Iterator[None]:
    """Within this block, keras.losses reductions return the plain mean of the replica's batch.

    Inside a replica, Keras `Loss` objects (e.g. `keras.losses.SparseCategoricalCrossentropy()`)
    multiply their mean by 1/replicas, while `keras.ops.mean` does not, so the same module would
    get different gradients and logged losses depending on how it wrote its loss. The Trainer
    traces its steps within this block and divides by the replica count itself, exactly once.
    The Keras function is restored when the outermost block ends.
    """
    global _depth
    with _lock:
        if _depth == 0:
            keras_loss_module.scale_loss_for_distribution = _unscaled
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                keras_loss_module.scale_loss_for_distribution = _original
