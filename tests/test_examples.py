"""The examples run as written and do what they say."""

from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_trains_to_a_useful_accuracy(tmp_path, capsys):
    namespace = runpy.run_path(str(EXAMPLES / "quickstart.py"))
    metrics = namespace["main"](str(tmp_path))
    assert metrics["val/acc"] > 0.85
    assert (tmp_path / "tensorboard" / "version_0").is_dir()
    assert "predicted classes:" in capsys.readouterr().out
