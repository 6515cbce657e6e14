"""A full disk during a save (RLIMIT_FSIZE in a fresh process): the save fails with the storage's error, the
earlier checkpoints stay as they were, and the run resumes from them."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys

from ktrainer.checkpoint import FsspecCheckpointIO
from ktrainer.utils.fs import Location
from tests.checkpoint.test_resume import RUNNER, inline

LIMIT = 4096  # bytes per file: the state file of a save (random state included) is larger


def _small_files_only() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_full_disk_fails_the_save_and_the_earlier_checkpoints_resume(tmp_path):
    root = tmp_path / "run"
    inline(root, 5, "32-true", "-", None, "--no-logger")  # commits step-00000005 at the epoch's end
    before = _tree(root / "checkpoints")
    done = subprocess.run([sys.executable, str(RUNNER), str(root), "10", "32-true", "last", json.dumps({}),
                           "--no-logger"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          preexec_fn=_small_files_only)
    assert done.returncode == 1
    assert "CheckpointError: Saving checkpoint " in done.stderr and "step-00000010 failed: OSError(27" in done.stderr
    assert "File too large" in done.stderr and "Checkpoints committed before are untouched" in done.stderr
    assert _tree(root / "checkpoints") == before  # the failed save's own files were removed, nothing else changed
    io = FsspecCheckpointIO(Location(str(root / "checkpoints")))
    assert [(info.name, info.valid) for info in io.list(checksums=True)] == [("step-00000005", True)]
    resumed = inline(root, 7, "32-true", "last", None, "--no-logger")
    assert [step for step, _ in resumed["losses"]] == [6, 7]
