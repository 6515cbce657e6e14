"""benchmarks/gpu_check.py --tiny: the GPU check's script runs whole on a CPU, so the GPU run finds no error of ours.

No timing is asserted (the figures of a tiny model on a shared CPU mean nothing): the script must finish with
every measurement reported, including the exactness checks it exits 1 on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.runs import NO_TENSORFLOW

pytestmark = pytest.mark.jax_only

SCRIPT = Path(__file__).parents[3] / "benchmarks" / "gpu_check.py"


def test_the_gpu_check_runs_every_measurement_on_a_cpu_without_tensorflow(tmp_path):
    done = subprocess.run([sys.executable, str(NO_TENSORFLOW), str(SCRIPT), "--tiny", "--budget", "600"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["errors"] == []
    for precision in ("32-true", "bf16-mixed"):
        for spe in (1, summary["steps_per_execution"]):
            for key in ("trainer_over_fit", "trainer_over_fit_run"):
                assert summary[f"{key}_{precision}_spe{spe}"] > 0
            assert summary[f"trainer_over_fit_{precision}_spe{spe}_window1"] > 0
    assert summary["resume_max_difference"] == summary["async_snapshot_resume_max_difference"] == 0.0
    assert summary["restored_weights_equal"] is True
    assert summary["fsdp_max_loss_difference"] == 0.0 and summary["fsdp_over_one_device"] > 0
    assert done.stdout.count("with a checkpoint every 8 steps and TensorBoard every step") == 4
