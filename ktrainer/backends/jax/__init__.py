"""The JAX engine: keras.distribution DataParallel, jitted stateless steps, virtual CPU devices, jax.distributed.

Nothing here imports TensorFlow: a run under KERAS_BACKEND=jax works in an environment without it.
"""

from __future__ import annotations

import jax

from ktrainer.backends.jax.devices import JaxDevicePlan, plan_devices
from ktrainer.backends.jax.engine import JaxEngine

__all__ = ["JaxDevicePlan", "plan_devices", "make_engine", "is_chief_process", "JaxEngine"]


def make_engine(plan: JaxDevicePlan) -> JaxEngine:
    """The JAX engine for a device plan."""
    return JaxEngine(plan)


def is_chief_process() -> bool:
    """Process 0 of a jax.distributed run; with one process, that process."""
    return jax.process_index() == 0
