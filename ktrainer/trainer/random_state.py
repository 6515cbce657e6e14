"""The process's random state (Python, numpy, Keras, and TensorFlow's on that backend), for exact resume.

TensorFlow's global generator is read only where the run is on TensorFlow: a checkpoint written on
JAX has no such entry, and one read on JAX ignores it (random streams differ across backends anyway).
"""

from __future__ import annotations

import random
from typing import Any

import keras
import numpy as np

from ktrainer.compat.keras_internals import keras_seed_state
from ktrainer.compat.tensorflow_parts import global_generator_state, set_global_generator_state

__all__ = ["capture_random_state", "restore_random_state"]


def capture_random_state() -> dict[str, Any]:
    """Every global random generator's state, as JSON values."""
    keras_state = keras_seed_state()  # first: Keras seeds a generator it creates from Python's `random`
    numpy_state = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
        "keras": np.asarray(keras_state).tolist(),
    }
    if _on_tensorflow():
        state["tensorflow"] = global_generator_state()
    return state


def restore_random_state(state: dict[str, Any]) -> None:
    """Put back what `capture_random_state` returned."""
    generator = keras_seed_state()  # before Python's state is set: creating it draws from `random`
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    if _on_tensorflow() and "tensorflow" in state:
        set_global_generator_state(state["tensorflow"])
    generator.assign(np.array(state["keras"], dtype=generator.dtype))


def _on_tensorflow() -> bool:
    return keras.config.backend() == "tensorflow"
