"""The Keras internals ktrainer cannot do without, in one place, checked when this module is imported.

- `keras.src.losses.loss.scale_loss_for_distribution`: inside a tf.distribute replica, Keras `Loss`
  objects multiply their mean by 1/replicas, while `keras.ops.mean` does not, so the same Module
  would get different gradients depending on how it wrote its loss. While the Trainer traces a step
  function, this scaling is turned off (`unscaled_losses`); the Trainer divides by the replica count
  itself, exactly once. Only the tracing is affected: Python code of a compiled step runs only then.
- `keras.src.random.seed_generator.global_seed_generator`: the state of Keras's global random
  generator (dropout without an explicit seed uses it), saved in checkpoints for an exact resume.
- `keras.src.utils.module_utils.tensorflow`: Keras's lazy handle on TensorFlow. `keras.utils.set_random_seed`
  and `keras.saving.serialize_keras_object` ask it whether TensorFlow is installed, which imports it
  (about 400 MiB and 1.5 s) even on the JAX backend. `tensorflow_left_alone` makes them take an
  unimported TensorFlow for absent, so a JAX run imports no TensorFlow even where it is installed.
- `Layer._flatten_layers`: every layer inside a model (nested models and layers assigned as
  attributes included), which `model.layers` does not give; `flat_layers` is the one caller.
- `Optimizer._learning_rate`: the learning rate as it was set (a schedule, a callable or a variable);
  the public `learning_rate` evaluates a schedule. `learning_rate_as_set` is the one reader.
- `KerasTensor._keras_history`: which layer made a symbolic tensor; `producing_layer_name` is the one reader.
- `Variable._layout`: the layout a variable was created with under a distribution (an optimizer moment takes
  its variable's); `variable_layout` is the one reader.
- `ModelParallel._layout_map`: the LayoutMap a user's ModelParallel was made with; `layout_map_of` is the one reader.

A Keras release that moved or renamed one fails the import with a message naming it, rather
than training with silently different numbers.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import keras

try:
    from keras.src.losses import loss as _keras_loss
    from keras.src.random.seed_generator import global_seed_generator
    from keras.src.utils import module_utils as _module_utils
except ImportError as error:  # pragma: no cover - depends on the installed Keras
    raise ImportError(f"ktrainer needs Keras internals that keras {keras.__version__} does not have ({error}); "
                      "install a Keras release ktrainer supports (see pyproject.toml).") from error

__all__ = ["unscaled_losses", "with_unscaled_losses", "keras_seed_state", "tensorflow_left_alone", "flat_layers",
           "learning_rate_as_set", "producing_layer_name", "variable_layout",
           "layout_map_of"]


def _check() -> None:
    scale = getattr(_keras_loss, "scale_loss_for_distribution", None)
    lazy_tensorflow = getattr(_module_utils, "tensorflow", None)
    if (not callable(scale) or not callable(global_seed_generator)
            or not hasattr(lazy_tensorflow, "_available") or not hasattr(type(lazy_tensorflow), "available")
            or not callable(getattr(keras.layers.Layer, "_flatten_layers", None))):
        raise ImportError(f"keras {keras.__version__} changed keras.src.losses.loss.scale_loss_for_distribution, "
                          "keras.src.random.seed_generator.global_seed_generator or "
                          "keras.src.utils.module_utils.tensorflow or Layer._flatten_layers, which ktrainer relies "
                          "on; install a Keras release ktrainer supports (see pyproject.toml).")


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


_tensorflow_lock = threading.Lock()
_tensorflow_depth = 0


@contextlib.contextmanager
def tensorflow_left_alone() -> Iterator[None]:
    """Within this block, Keras takes TensorFlow for not installed unless it is imported already or is the backend.

    `keras.utils.set_random_seed` then seeds Python, NumPy and Keras (and TensorFlow only when the user's own
    code imported it, e.g. for tf.data), and `keras.saving.serialize_keras_object` skips its TensorFlow type
    checks, which cannot match an object of a process that never imported TensorFlow. Nested and concurrent
    blocks are counted; Keras asks again after the last one ends.
    """
    global _tensorflow_depth
    lazy = _module_utils.tensorflow
    if "tensorflow" in sys.modules or keras.config.backend() == "tensorflow":
        yield
        return
    with _tensorflow_lock:
        if _tensorflow_depth == 0:
            lazy._available = False
        _tensorflow_depth += 1
    try:
        yield
    finally:
        with _tensorflow_lock:
            _tensorflow_depth -= 1
            if _tensorflow_depth == 0:
                lazy._available = None  # asked afresh (True if code in the block imported TensorFlow after all)


def flat_layers(model: Any) -> list[Any]:
    """Every layer inside `model`, depth first, the model itself excluded (nested models and sub-layers too)."""
    return list(model._flatten_layers(include_self=False))


def learning_rate_as_set(optimizer: Any) -> Any:
    """The learning rate of a Keras optimizer as it was set: a `LearningRateSchedule`, a callable or a variable."""
    return optimizer._learning_rate


def producing_layer_name(tensor: Any) -> str | None:
    """The name of the layer whose call made the symbolic `tensor` (a functional model's output), or None."""
    return getattr(getattr(getattr(tensor, "_keras_history", None), "operation", None), "name", None)


def variable_layout(variable: Any) -> Any:
    """The `TensorLayout` a Keras variable was created with (None: no distribution placed it)."""
    return getattr(variable, "_layout", None)


def layout_map_of(distribution: Any) -> Any:
    """The `LayoutMap` of a `keras.distribution.ModelParallel` (None for any other distribution, or None)."""
    return getattr(distribution, "_layout_map", None)
