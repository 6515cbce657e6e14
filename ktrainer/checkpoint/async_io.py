"""Saving in the background: a wrapper around any CheckpointIO, with at most one save in flight."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ktrainer.checkpoint.io import CheckpointInfo, CheckpointIO, FileSource, OnCommit

__all__ = ["AsyncCheckpointIO"]


class AsyncCheckpointIO:
    """Runs `write` of the wrapped store in a background thread; everything else passes through.

    The caller hands over a snapshot it will not change (a copy of the state in host memory). A
    write waits for the one before it, so at most one is in flight; a failure in the background
    is raised by the next `write`, by `wait()` or by `close()`. `close()` waits and shuts the
    thread down: call it when training ends, also after an error.

    Args:
        inner: The store that does the writing.
    """

    def __init__(self, inner: CheckpointIO) -> None:
        self.inner = inner
        self.url = inner.url
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def write(self, name: str, files: dict[str, bytes | FileSource], fields: dict[str, Any], *,
              on_commit: OnCommit | None = None, **options: Any) -> None:
        """Start writing in the background (after the previous write finished; its failure is raised here)."""
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ktrainer-async-save")
        self._pending = self._executor.submit(self.inner.write, name, files, fields, on_commit=on_commit, **options)

    def wait(self) -> None:
        """Wait for the write in flight, if any; raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    @property
    def in_flight(self) -> bool:
        """True while a background write has not finished."""
        return self._pending is not None and not self._pending.done()

    def close(self) -> None:
        """Wait for the write in flight, then stop the background thread (the write's error is raised)."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def read(self, name: str, *, arrays: bool = False) -> tuple[CheckpointInfo, dict[str, Any]]:
        """Read through the wrapped store."""
        return self.inner.read(name, arrays=arrays)

    def list(self, *, checksums: bool = False, names: list[str] | None = None) -> list[CheckpointInfo]:
        """List through the wrapped store."""
        return self.inner.list(checksums=checksums, names=names)

    def delete(self, name: str, **options: Any) -> None:
        """Delete through the wrapped store."""
        self.inner.delete(name, **options)
