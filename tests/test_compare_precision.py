"""compare-precision on the demo: 16-mixed and bf16-mixed track float32; the tool reports it, CLI included."""

from __future__ import annotations

import logging
import os
import re
import sys
import textwrap
from pathlib import Path

import keras
import pytest

import ktrainer as kt
from ktrainer.compare_precision import PLOT_HINT, PrecisionComparison, RunRecord
from ktrainer.demos import DemoClassifier
from tests.early import StartedProcess
from tests.helpers import read_scalars

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Measured on the demo (100 steps, batch 32, seed 0): mean gap 0.2-0.3%, max 1-2%. The bounds leave room.
MEAN_GAP_TOLERANCE = 0.02
MAX_GAP_TOLERANCE = 0.10


@pytest.mark.parametrize("precision", ["16-mixed", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
def test_lower_precisions_track_float32_on_the_demo(tmp_path, precision):
    # Both runs in this process (the CLI test below covers a process per run and its memory figures).
    result = kt.compare_precision(DemoClassifier, precision, steps=100, root=str(tmp_path), batch_size=32,
                                  isolate=False)
    assert result.mean_relative_gap < MEAN_GAP_TOLERANCE
    assert result.max_relative_gap < MAX_GAP_TOLERANCE
    assert result.non_finite_steps == 0 and result.skipped_steps == 0
    assert result.verdict in ("tracks", "no speedup on this hardware")  # a CPU gives no speedup
    assert result.speed_ratio > 0
    for record in (result.baseline, result.run):
        assert record.memory_measure.endswith("shared by both runs") and record.peak_memory > 0
    assert len(result.baseline.losses) == len(result.run.losses) == 100
    assert result.baseline.losses[-1] < 0.5 * result.baseline.losses[0]
    png = tmp_path / f"loss-32-true-vs-{precision}.png"
    assert sorted(os.listdir(tmp_path)) == sorted(["32-true", precision, png.name])
    for run in ("32-true", precision):
        assert len(read_scalars(str(tmp_path / run / "version_0"))["train/loss_step"]) == 100
    assert result.plot == str(png) and png.read_bytes().startswith(PNG_SIGNATURE)
    report = result.report()
    assert "loss gap after warm-up" in report and f"tensorboard --logdir {tmp_path}" in report
    assert f"plot: {png}" in report and "shared by both runs" in report


class Explodes(DemoClassifier):
    """Fine in float32; in float16 a large activation penalty overflows (float16 ends at 65504)."""

    def training_step(self, batch):
        hidden = self.model.layers[0](batch[0])  # computes in the policy's dtype
        penalty = keras.ops.cast(keras.ops.sum(keras.ops.square(hidden * 1000.0)), "float32")
        return super().training_step(batch) + 1e-12 * penalty


@pytest.mark.both_backends  # and so compare-precision runs on JAX without TensorFlow
def test_a_precision_that_breaks_is_diverges():
    result = kt.compare_precision(Explodes, "16-mixed", steps=20, root=None, batch_size=32, isolate=False)
    assert result.non_finite_steps > 0
    assert result.verdict == "diverges"
    assert result.plot is None and "plot:" not in result.report()  # root=None: no files
    assert result.run.memory_measure.endswith("shared by both runs")  # isolate=False: one process


class Unsendable:
    """A module factory that cannot be pickled, so it cannot reach a process of its own."""

    def __reduce__(self):
        raise TypeError("this factory stays in its process")

    def __call__(self):
        return DemoClassifier(num_examples=200)


def test_a_factory_that_cannot_reach_a_process_runs_here_and_says_the_memory_is_shared(caplog):
    with caplog.at_level(logging.WARNING, logger="ktrainer"):
        result = kt.compare_precision(Unsendable(), "bf16-mixed", steps=4, root=None, batch_size=32)
    assert "runs both precisions in this process (TypeError: this factory stays in its process)" in caplog.text
    assert result.baseline.memory_measure.endswith("shared by both runs")
    assert len(result.run.losses) == 4


def test_an_error_in_a_run_reaches_the_caller_with_the_run_traceback():
    with pytest.raises(ValueError, match="No train_data") as raised:
        kt.compare_precision(NoData, "bf16-mixed", steps=4, root=None)
    assert any("In the 32-true run's process" in note for note in raised.value.__notes__)


class NoData(DemoClassifier):
    def train_data(self):
        return None


def _comparison(warmup: int = 1) -> PrecisionComparison:
    baseline = RunRecord("32-true", [1.0, 0.8, 0.6], 10.0, 0, 2**20, "peak RSS of its own process", "r/32-true/v")
    run = RunRecord("16-mixed", [1.0, float("nan"), 0.61], 9.0, 1, 2**20, "peak RSS of its own process",
                    "r/16-mixed/v")
    return PrecisionComparison("16-mixed", warmup, 0.02, 0.01, 1, 1, 0.9, "diverges", baseline, run)


def test_the_plot_is_a_png_and_without_matplotlib_the_report_says_how_to_get_it(tmp_path, monkeypatch):
    result = _comparison()
    assert result.save_plot(str(tmp_path)) == str(tmp_path / "loss-32-true-vs-16-mixed.png")
    assert (tmp_path / "loss-32-true-vs-16-mixed.png").read_bytes().startswith(PNG_SIGNATURE)
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it fails
    missing = _comparison()
    assert missing.save_plot(str(tmp_path / "other")) is None and not (tmp_path / "other").exists()
    assert missing.report().count("pip install ktrainer[plot]") == 1 and PLOT_HINT in missing.report()


BALLAST_BYTES = 2**31  # 2 GiB resident in the CLI's process, none of it in the runs' own processes
CLI = f"""
import sys

import numpy as np

from ktrainer.cli.main import main

ballast = np.ones({BALLAST_BYTES} // 8)
sys.exit(main(sys.argv[1:]))
"""


def compare_precision_cli(folder: Path) -> StartedProcess:
    """A start (tests/early.py): the CLI's compare-precision on a user's file, run by `main` in a process of its
    own that holds BALLAST_BYTES, so that its two runs' processes train while the tests before this one do."""
    user_file = folder / "demo_module.py"
    user_file.write_text(textwrap.dedent("""
        from ktrainer.demos import DemoClassifier as Demo
    """))
    return StartedProcess([sys.executable, "-c", CLI, "compare-precision", f"{user_file}:Demo", "--precision",
                           "bf16-mixed", "--steps", "30", "--root", str(folder / "runs"), "--module-kwargs",
                           '{"num_examples": 1000}'], folder)


@pytest.mark.starts_early(start=compare_precision_cli)
def test_cli_compare_precision_measures_each_run_in_its_own_process(started):
    cli = started(compare_precision_cli)
    done = cli.finished()
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-4000:]
    assert "compare-precision: bf16-mixed against 32-true, 30 steps, warm-up 3" in out
    assert "verdict:" in out and "of its own process" in out
    line = next(each for each in out.splitlines() if "peak memory:" in each)
    peaks = [int(each) * 2**20 for each in re.findall(r"(\d+) MiB", line)]
    assert len(peaks) == 2 and all(0 < peak < BALLAST_BYTES for peak in peaks), line
    png = cli.cwd / "runs" / "loss-32-true-vs-bf16-mixed.png"
    assert f"plot: {png}" in out and png.read_bytes().startswith(PNG_SIGNATURE)


def test_bad_arguments():
    with pytest.raises(ValueError, match="precision='8' is not supported"):
        kt.compare_precision(DemoClassifier, "8")
    with pytest.raises(ValueError, match="warmup=50 leaves nothing to compare"):
        kt.compare_precision(DemoClassifier, steps=20, warmup=50)
