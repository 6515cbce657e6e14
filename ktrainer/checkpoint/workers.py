"""The threads that write and read a checkpoint's files (and a restore's slices) in parallel."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["io_workers"]

_MAX_WORKERS = 4
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def io_workers() -> ThreadPoolExecutor:
    """The pool, started once per process (starting threads for every save cost more than writing a small
    model's checkpoint). Never wait on it from one of its own tasks: four waiting tasks would wait forever."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_MAX_WORKERS, thread_name_prefix="ktrainer-io")
        return _pool


def _forget_pool_after_fork() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # a forked child has none of the parent's threads


os.register_at_fork(after_in_child=_forget_pool_after_fork)
