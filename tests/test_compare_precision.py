"""compare-precision on the demo: 16-mixed and bf16-mixed track float32; the tool reports it, CLI included."""

from __future__ import annotations

import os
import textwrap

import keras
import pytest

import ktrainer as kt
from ktrainer.cli.main import main
from ktrainer.demos import DemoClassifier
from tests.helpers import read_scalars

# Measured on the demo (100 steps, batch 32, seed 0): mean gap 0.2-0.3%, max 1-2%. The bounds leave room.
MEAN_GAP_TOLERANCE = 0.02
MAX_GAP_TOLERANCE = 0.10


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_lower_precisions_track_float32_on_the_demo(tmp_path, precision):
    result = kt.compare_precision(DemoClassifier, precision, steps=100, root=str(tmp_path), batch_size=32)
    assert result.mean_relative_gap < MEAN_GAP_TOLERANCE
    assert result.max_relative_gap < MAX_GAP_TOLERANCE
    assert result.non_finite_steps == 0 and result.skipped_steps == 0
    assert result.verdict in ("tracks", "no speedup on this hardware")  # a CPU gives no speedup
    assert result.speed_ratio > 0 and result.baseline.peak_memory and result.run.peak_memory
    assert len(result.baseline.losses) == len(result.run.losses) == 100
    assert result.baseline.losses[-1] < 0.5 * result.baseline.losses[0]
    runs = sorted(os.listdir(tmp_path))
    assert runs == sorted(["32-true", precision])
    for run in runs:
        assert len(read_scalars(str(tmp_path / run / "version_0"))["train/loss_step"]) == 100
    report = result.report()
    assert "loss gap after warm-up" in report and f"tensorboard --logdir {tmp_path}" in report


class Explodes(DemoClassifier):
    """Fine in float32; in float16 a large activation penalty overflows (float16 ends at 65504)."""

    def training_step(self, batch):
        hidden = self.model.layers[0](batch[0])  # computes in the policy's dtype
        penalty = keras.ops.cast(keras.ops.sum(keras.ops.square(hidden * 1000.0)), "float32")
        return super().training_step(batch) + 1e-12 * penalty


def test_a_precision_that_breaks_is_diverges():
    result = kt.compare_precision(Explodes, "16-mixed", steps=20, root=None, batch_size=32)
    assert result.non_finite_steps > 0
    assert result.verdict == "diverges"


def test_cli_compare_precision(tmp_path, capsys):
    user_file = tmp_path / "demo_module.py"
    user_file.write_text(textwrap.dedent("""
        from ktrainer.demos import DemoClassifier as Demo
    """))
    status = main(["compare-precision", f"{user_file}:Demo", "--precision", "bf16-mixed", "--steps", "30",
                   "--root", str(tmp_path / "runs"), "--module-kwargs", '{"num_examples": 1000}'])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "compare-precision: bf16-mixed against 32-true, 30 steps, warm-up 3" in out
    assert "verdict:" in out


def test_bad_arguments():
    with pytest.raises(ValueError, match="precision='8' is not supported"):
        kt.compare_precision(DemoClassifier, "8")
    with pytest.raises(ValueError, match="warmup=50 leaves nothing to compare"):
        kt.compare_precision(DemoClassifier, steps=20, warmup=50)
