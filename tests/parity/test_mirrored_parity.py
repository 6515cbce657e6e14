"""devices=2 trains, and evaluates metric objects, as model.fit under MirroredStrategy on the same 2 logical CPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np


def test_two_devices_train_and_validate_as_fit_under_mirrored_strategy(tmp_path):
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("mirrored_run.py"))], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["max_weight_difference"] < 1e-5
    keras_history, ours = result["keras"], result["ours"]
    np.testing.assert_allclose(ours["train/loss_epoch"], keras_history["loss"], atol=1e-5)
    for name in ("loss", "precision", "recall", "auc"):  # exact over both replicas and the uneven last batch
        np.testing.assert_allclose(ours[f"val/{name}"], keras_history[f"val_{name}"], atol=1e-4)
