"""Every python block of README.md and docs/*.md marked `<!-- runnable -->` runs as it stands, and the README's
quick start is examples/quickstart.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKED = re.compile(r"<!-- runnable -->\n```python\n(.*?)```", re.DOTALL)


def runnable_blocks() -> list[tuple[str, str]]:
    """(where, code) of every block marked runnable."""
    blocks = []
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, code in enumerate(MARKED.findall(document.read_text(encoding="utf-8"))):
            blocks.append((f"{document.relative_to(ROOT)}#{number}", code))
    return blocks


def test_the_readme_marks_its_quick_start_runnable_and_it_is_the_example():
    (where, code), *_ = runnable_blocks()
    assert where == "README.md#0"
    assert code in (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(("where", "code"), runnable_blocks(), ids=[where for where, _ in runnable_blocks()])
def test_a_runnable_block_runs_as_written(where, code, tmp_path):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
    if where == "README.md#0":  # the quick start trains, resumes to epoch 5 and validates well
        lines = done.stderr.splitlines()  # a script without logging set up sees each event once
        assert sum(line == "Fit:" for line in lines) == 2 and sum(line.startswith("Stopped:") for line in lines) == 2
        assert "Stopped: max_epochs=5 reached, at step 240 (epoch 5)" in done.stderr
        assert "resumed from runs/exp1/checkpoints/step-00000144 at step 144" in done.stderr
        metrics = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - the dict the block prints
        assert metrics["val/acc"] > 0.9
