"""The two Keras internals ktrainer cannot do without, in one place, checked when this module is imported.

- `keras.src.losses.loss.scale_loss_for_distribution`: inside a tf.distribute replica, Keras `Loss`
  objects multiply their mean by 1/replicas, while `keras.ops.mean` does not, so the same Module
  would get different gradients depending on how it wrote its loss. While the Trainer traces a step
  function, this scaling is turned off (`unscaled_losses`); the Trainer divides by the replica count
  itself, exactly once. Only the tracing is affected: Python code of a compiled step runs only then.
- `keras.src.random.seed_generator.global_seed_generator`: the state of Keras's global random
  generator (dropout without an explicit seed uses it), saved in checkpoints for an exact resume.

A Keras release that moved or renamed either fails the import with a message naming it, rather
than training with silently different numbers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import keras

try:
    from keras.src.losses import loss as _keras_loss
    from keras.src.random.seed_generator import global_seed_generator
except ImportError as error:  # pragma: no cover - depends on the installed Keras
    raise ImportError(f"ktrainer needs Keras internals that keras {keras.__version__} does not have ({error}); "
                      "install a Keras release ktrainer supports (see pyproject.toml).") from error

__all__ = ["unscaled_losses", "with_unscaled_losses", "keras_seed_state"]


def _check() -> None:
    scale = getattr(_keras_loss, "scale_loss_for_distribution", None)
    if not callable(scale) or not callable(global_seed_generator):
        raise ImportError(f"keras {keras.__version__} changed keras.src.losses.loss.scale_loss_for_distribution or "
                          "keras.src.random.seed_generator.global_seed_generator, which ktrainer relies on; install "
                          "a Keras release ktrainer supports (see pyproject.toml).")


_check()

_lock = threading.Lock()
_depth = 0
_original = _keras_loss.scale_loss_for_distribution


def _unscaled(value: Any) -> Any:
    return value


@contextlib.contextmanager
def unscaled_losses() -> Iterator[None]:
    """Within this block (on any thread: MirroredStrategy traces each replica in its own), keras.losses
    reductions return the plain mean of the replica's batch. Nested and concurrent blocks are counted;
    Keras's function is back when the last one ends."""
    global _depth
    with _lock:
        if _depth == 0:
            _keras_loss.scale_loss_for_distribution = _unscaled
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _keras_loss.scale_loss_for_distribution = _original


def with_unscaled_losses(step: Callable[..., Any]) -> Callable[..., Any]:
    """`step` running inside `unscaled_losses()`: for the per-replica step functions the Trainer compiles, whose
    Python body runs only while TensorFlow traces them."""

    def traced(*args: Any, **kwargs: Any) -> Any:  # no functools.wraps: AutoGraph would inspect a step object
        with unscaled_losses():
            return step(*args, **kwargs)

    return traced


def keras_seed_state() -> Any:
    """The variable holding Keras's global random generator's state."""
    return global_seed_generator().state
