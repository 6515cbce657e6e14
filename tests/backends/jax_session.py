"""The JAX session: the shared tests, run on JAX by pytest in a process that refuses to import TensorFlow.

A test file marked `both_backends` holds promises both engines keep. The TensorFlow session (the README's
test command) runs it in-process, and starts this second session on JAX as soon as collection ends, so the
two run side by side on the machine's cores; `tests/backends/test_shared_on_jax.py` reads its JUnit report
at the end, one test per shared file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.backends.runs import NO_TENSORFLOW

ROOT = Path(__file__).parents[2]
MARKS = re.compile(r"pytest\.mark\.(both_backends|jax_only)\b")  # a file-level mark, in a list or alone, or a test's
STASH = pytest.StashKey["JaxSession"]()  # where the TensorFlow session keeps the one it started
TIMEOUT_S = 1800  # the whole JAX session; it takes a few minutes on 2 loaded cores


def shared_files() -> list[str]:
    """Test files (relative to the repository root) holding at least one both_backends or jax_only test."""
    return [str(path.relative_to(ROOT)) for path in sorted((ROOT / "tests").rglob("test_*.py"))
            if MARKS.search(path.read_text())]


class JaxSession:
    """pytest over `shared_files()` under KERAS_BACKEND=jax, started now, in the background."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="ktrainer-jax-session-")
        folder = Path(self._folder.name)
        self.report, self.output = folder / "report.xml", folder / "output.txt"
        environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
        with self.output.open("w") as output:  # a file, not a pipe: nobody reads while the session runs
            self._process = subprocess.Popen(
                [sys.executable, str(NO_TENSORFLOW), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 f"--junitxml={self.report}", *shared_files()],
                cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT)
        self._cases: dict[str, list[ElementTree.Element]] | None = None

    def cases(self) -> dict[str, list[ElementTree.Element]]:
        """Wait for the session to end; its test cases, by file (relative to the repository root)."""
        if self._cases is None:
            self._process.wait(timeout=TIMEOUT_S)
            if not self.report.exists():
                raise AssertionError(f"the JAX session wrote no report (exit {self._process.returncode}):\n"
                                     f"{self.output.read_text()[-6000:]}")
            self._cases = {}
            for case in ElementTree.parse(self.report).iter("testcase"):
                module = [part for part in case.get("classname", "").split(".") if not part[:1].isupper()]
                self._cases.setdefault("/".join(module) + ".py", []).append(case)
        return self._cases

    def close(self) -> None:
        """Stop the session if it still runs (the TensorFlow session ended early), and remove its files."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._folder.cleanup()
