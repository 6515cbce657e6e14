"""A float16 step on XLA's CPU backend: compiled once before the run, so a missing kernel is ktrainer's error.

XLA's CPU backend has no float16 matrix product that accumulates in float32 (`jax.lax.DotAlgorithmPreset`
"F16_F16_F32", which `jax.nn.dot_product_attention`, hence `keras.layers.MultiHeadAttention`, asks for
under a float16 policy). JAX finds it only while lowering the step, which would be the first training call,
after the run's folders exist; lowering the forward pass while the step is prepared finds it first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["check_float16_lowers_on_cpu"]

_XLA_CPU_REFUSAL = "is not supported by dot_general on CPU"


def check_float16_lowers_on_cpu(forward: Callable[[Any], Any], batch_spec: Any, devices: list,
                                compute_dtype: str, precision_name: str) -> None:
    """Lower `forward` on `batch_spec` when float16 runs on CPU devices; explain a matrix product XLA lacks.

    Raises:
        ValueError: What failed, why, and which precision to use on a CPU instead.
    """
    if compute_dtype != "float16" or any(device.platform != "cpu" for device in devices):
        return
    try:
        jax.jit(forward).lower(batch_spec)
    except ValueError as error:
        if _XLA_CPU_REFUSAL not in str(error):
            raise
        raise ValueError(
            f"precision={precision_name!r}: the training step does not compile on this CPU. It asks for a "
            "float16 matrix product that accumulates in float32 (jax.nn.dot_product_attention does, which "
            "keras.layers.MultiHeadAttention uses), and XLA's CPU backend lacks this float16 matmul "
            f"(JAX: {error}). Use precision=\"bf16-mixed\" or \"32-true\" on a CPU; \"16-mixed\" is for GPUs."
        ) from None  # JAX's words are in the message; its lowering traceback only hides them
