"""The seam between the Trainer and an engine: one small interface, one package per Keras backend.

The Trainer, callbacks, loggers, checkpoints, precision policy, data position and metrics speak
Keras, numpy and plain Python; everything that needs TensorFlow or JAX is an `Engine` method,
implemented in `backends/tensorflow/` and `backends/jax/`. The engine follows the backend Keras
runs on (`KERAS_BACKEND`, `keras.config.backend()`), so the same Module runs on either.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import keras

from ktrainer.backends.engine import Engine

__all__ = ["Engine", "BACKENDS", "backend_name", "backend_version", "plan_devices", "make_engine", "is_chief_process"]

BACKENDS = ("tensorflow", "jax")


def backend_name() -> str:
    """The Keras backend of this process, checked to be one ktrainer runs on.

    Raises:
        ImportError: For a backend without an engine (e.g. "torch"), naming those that have one.
    """
    name = keras.config.backend()
    if name not in BACKENDS:
        raise ImportError(f"ktrainer runs Keras on {' or '.join(BACKENDS)}, but Keras was started with the {name!r} "
                          "backend. Set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax before importing keras.")
    return name


def backend_version() -> str:
    """The version of the framework Keras runs on (TensorFlow or JAX), "?" when it does not say."""
    name = keras.config.backend()
    framework = sys.modules.get(name) or importlib.import_module(name)
    return getattr(framework, "__version__", "?")


def _package() -> Any:
    return importlib.import_module(f"ktrainer.backends.{backend_name()}")


def plan_devices(accelerator: str, devices: Any, strategy: Any, num_nodes: int, mesh: Any = None,
                 fsdp_min_bytes: int = 2**20) -> Any:
    """Check the Trainer's device arguments against this backend's devices and return its plan.

    Raises:
        ValueError: For values that are wrong, conflict, or ask for devices that are not there.
    """
    return _package().plan_devices(accelerator, devices, strategy, num_nodes, mesh, fsdp_min_bytes)


def make_engine(plan: Any) -> Engine:
    """The engine of this backend for a device plan."""
    return _package().make_engine(plan)


def is_chief_process() -> bool:
    """True in the process that writes logs and checkpoints (always, with one process)."""
    return _package().is_chief_process()
