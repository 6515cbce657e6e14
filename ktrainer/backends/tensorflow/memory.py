"""Peak memory of a stretch of work: the accelerator's allocator peak, or the process's peak RSS on CPU."""

from __future__ import annotations

import re

import tensorflow as tf

__all__ = ["reset_peak_memory", "peak_memory"]


def _first_gpu() -> str | None:
    return "GPU:0" if tf.config.list_physical_devices("GPU") else None


def reset_peak_memory() -> None:
    """Start a new peak: the GPU allocator's statistics, or the process's high-water mark (Linux)."""
    gpu = _first_gpu()
    if gpu is not None:
        tf.config.experimental.reset_memory_stats(gpu)
        return
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM, the peak resident set size, to the current size
    except OSError:
        pass


def peak_memory() -> tuple[int | None, str]:
    """The peak since `reset_peak_memory`, in bytes, and what was measured (None where unavailable)."""
    gpu = _first_gpu()
    if gpu is not None:
        return int(tf.config.experimental.get_memory_info(gpu)["peak"]), f"{gpu} allocator peak"
    try:
        with open("/proc/self/status") as handle:
            match = re.search(r"VmHWM:\s+(\d+) kB", handle.read())
    except OSError:
        match = None
    if match is None:
        return None, "unavailable on this platform"
    return int(match.group(1)) * 1024, "process peak RSS"
