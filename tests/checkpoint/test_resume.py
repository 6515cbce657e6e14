"""Exact resume: N steps straight equal k steps, then a fresh process resuming to N (weights and losses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

RUNNER = Path(__file__).with_name("resume_run.py")
N = 12  # 5 batches per epoch: steps 5 and 10 end epochs


def leg(cwd, root, max_steps, precision, ckpt="-", options=None):
    done = subprocess.run([sys.executable, str(RUNNER), str(root), str(max_steps), precision, ckpt,
                           json.dumps(options or {})], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def weights(result):
    with np.load(result["weights"]) as loaded:
        return [loaded[name] for name in loaded.files]


@pytest.fixture(scope="module", params=["32-true", "16-mixed"])
def straight(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight")
    return request.param, leg(folder, folder / "run", N, request.param)


@pytest.mark.parametrize("k", [5, 7], ids=["epoch-boundary", "mid-epoch"])
def test_resumed_run_equals_the_straight_run(straight, k, tmp_path):
    precision, whole = straight
    first = leg(tmp_path, tmp_path / "run", k, precision)
    assert first["step"] == k
    second = leg(tmp_path, tmp_path / "run", N, precision, "last")
    assert [s for s, _ in second["losses"]] == list(range(k + 1, N + 1))
    joined = first["losses"] + second["losses"]
    np.testing.assert_allclose([v for _, v in joined], [v for _, v in whole["losses"]], rtol=0, atol=1e-6)
    for resumed, reference in zip(weights(second), weights(whole), strict=True):
        np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)
    assert (second["step"], second["epoch"]) == (whole["step"], whole["epoch"])
    assert second["scale"] == whole["scale"]
