"""Peak memory on TensorFlow: the first GPU's allocator peak, else the process's peak RSS."""

from __future__ import annotations

import tensorflow as tf

from ktrainer.utils.memory import process_peak, reset_process_peak

__all__ = ["reset_peak_memory", "peak_memory"]


def _first_gpu() -> str | None:
    return "GPU:0" if tf.config.list_physical_devices("GPU") else None


def reset_peak_memory() -> None:
    """Start a new peak: the GPU allocator's statistics, or the process's high-water mark."""
    gpu = _first_gpu()
    if gpu is not None:
        tf.config.experimental.reset_memory_stats(gpu)
        return
    reset_process_peak()


def peak_memory() -> tuple[int | None, str]:
    """The peak since `reset_peak_memory`, in bytes, and what was measured (None where unavailable)."""
    gpu = _first_gpu()
    if gpu is not None:
        return int(tf.config.experimental.get_memory_info(gpu)["peak"]), f"{gpu} allocator peak"
    return process_peak()
