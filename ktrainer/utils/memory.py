"""The process's peak resident memory: what a run on the CPU peaked at (an engine measures its accelerators)."""

from __future__ import annotations

import re
import sys

__all__ = ["reset_process_peak", "process_peak", "return_freed_memory"]

_libc = None


def reset_process_peak() -> None:
    """Start a new peak: reset the process's high-water mark to its current size (Linux; elsewhere nothing)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM, the peak resident set size, to the current size
    except OSError:
        pass


def process_peak() -> tuple[int | None, str]:
    """The process's peak resident memory in bytes, and what was measured (None where unavailable).

    On Linux /proc's VmHWM (since `reset_process_peak`), not getrusage's ru_maxrss: a spawned child's
    ru_maxrss starts at its parent's peak (the kernel carries it across exec), VmHWM at its own.
    getrusage where /proc is missing (macOS, in bytes there).
    """
    try:
        with open("/proc/self/status") as handle:
            match = re.search(r"VmHWM:\s+(\d+) kB", handle.read())
    except OSError:
        match = None
    if match is not None:
        return int(match.group(1)) * 1024, "process peak RSS"
    try:
        import resource
    except ImportError:
        return None, "unavailable on this platform"
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "process peak RSS (getrusage)"


def return_freed_memory() -> None:
    """Give the memory freed in this process back to the system now (glibc's `malloc_trim`; elsewhere nothing).

    Arrays on JAX's CPU devices are allocated and freed by XLA's threads, into their own malloc arenas,
    which glibc does not shrink on its own: a restore that replaces a state variable by variable would
    otherwise keep every replaced buffer resident, doubling the state's memory at its peak.
    """
    global _libc
    if not sys.platform.startswith("linux"):
        return
    if _libc is None:
        import ctypes
        import ctypes.util

        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # musl and others: no malloc_trim
            _libc = False
    if _libc:
        _libc.malloc_trim(0)
