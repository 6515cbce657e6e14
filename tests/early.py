"""Slow processes a test waits for, started as soon as collection ends, so that they run while other tests do.

A process with a device layout of its own, or a CLI measuring its memory, would hold up the test waiting for it;
started early, it runs beside the tests before it, on the machine's other core. A test (or a module, by
`pytestmark`) marked `starts_early(start=...)` asks for it: `start(folder)` starts the work in `folder` (a fresh
temporary folder of its own) and returns at once, with an object whose `close()` stops it. When collection ends
(-k and -m applied), tests/conftest.py calls once each `start` that the tests left to run are marked with; the
`started` fixture hands a test what `start` began (begun then, if no mark asked for it), and the session's end
stops what still runs.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

MARK = "starts_early(start): start(folder) starts a slow process the test waits for, when collection ends"
STASH = pytest.StashKey["EarlyStarts"]()


class StartedProcess:
    """A command running in a process of its own while the caller goes on; `finished()` waits for it."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str] | None = None):
        self.cwd = Path(cwd)
        # Files, not pipes: a child never blocks on a full pipe while the caller is busy elsewhere.
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen(command, stdout=self._out, stderr=self._err, text=True, cwd=cwd, env=env)
        self._finished: subprocess.CompletedProcess | None = None

    def finished(self) -> subprocess.CompletedProcess:
        """Wait for the process to end (at most 10 minutes); its exit status, standard output and error."""
        if self._finished is None:
            try:
                returncode = self._process.wait(timeout=600)
            finally:
                self.close()
            self._out.seek(0), self._err.seek(0)
            self._finished = subprocess.CompletedProcess(self._process.args, returncode, self._out.read(),
                                                         self._err.read())
        return self._finished

    def result(self) -> Any:
        """Wait for the process to succeed; the JSON value it printed last."""
        done = self.finished()
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        """Stop the process if it still runs."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


class EarlyStarts:
    """What each `start` began in this session, each in a temporary folder of its own."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="ktrainer-early-")
        self._started: dict[Callable[[Path], Any], Any] = {}

    def start(self, start: Callable[[Path], Any]) -> Any:
        """What `start` began: started now, unless it already was."""
        if start not in self._started:
            self._started[start] = start(Path(tempfile.mkdtemp(dir=self._folder.name)))
        return self._started[start]

    def close(self) -> None:
        """Stop what still runs and remove the folders."""
        for started in self._started.values():
            started.close()
        self._folder.cleanup()


def starts(config: pytest.Config) -> EarlyStarts:
    """This session's early starts."""
    if STASH not in config.stash:
        config.stash[STASH] = EarlyStarts()
    return config.stash[STASH]


def start_marked(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start, once each, what the tests that will run are marked `starts_early` with (nothing for --collect-only)."""
    if config.option.collectonly:
        return
    for start in dict.fromkeys(mark.kwargs["start"] for item in items for mark in item.iter_markers("starts_early")):
        starts(config).start(start)
