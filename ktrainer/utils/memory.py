"""The process's peak resident memory: what a run on the CPU peaked at (an engine measures its accelerators)."""

from __future__ import annotations

import re
import sys

__all__ = ["reset_process_peak", "process_peak"]


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
