"""Exact resume, in fresh processes: N steps straight equal k steps, then a new process resuming to N."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

RUNNER = Path(__file__).with_name("resume_run.py")
N = 12  # 5 batches per epoch: steps 5 and 10 end epochs


def leg(cwd, root, max_steps, precision, ckpt="-", options=None, *extra):
    done = subprocess.run([sys.executable, str(RUNNER), str(root), str(max_steps), precision, ckpt,
                           json.dumps(options or {}), *extra], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def weights(result):
    with np.load(result["weights"]) as loaded:
        return [loaded[name] for name in loaded.files]


def assert_same_run(first, second, whole, k, atol=1e-6):
    assert [s for s, _ in second["losses"]][-1] == whole["step"]
    joined = first["losses"] + second["losses"]
    np.testing.assert_allclose([v for _, v in joined], [v for _, v in whole["losses"]], rtol=0, atol=atol)
    for resumed, reference in zip(weights(second), weights(whole), strict=True):
        np.testing.assert_allclose(resumed, reference, rtol=0, atol=atol)
    assert (second["step"], second["epoch"]) == (whole["step"], whole["epoch"])


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
    assert_same_run(first, second, whole, k)
    assert second["scale"] == whole["scale"]


def test_seed_none_resumes_exactly_with_the_drawn_shuffle_seed(tmp_path):
    # The straight run draws its own shuffle seed and initial weights, checkpoints step 7 on its way
    # to 12; a new process resuming that checkpoint must continue with the same data order.
    whole = leg(tmp_path, tmp_path / "run", N, "32-true", "-", None, "--seed", "none", "--every-n-steps", "7")
    other = leg(tmp_path, tmp_path / "other", 7, "32-true", "-", None, "--seed", "none")
    assert other["shuffle_seed"] != whole["shuffle_seed"]  # really drawn: another process, another order
    second = leg(tmp_path, tmp_path / "resumed", N, "32-true", str(tmp_path / "run" / "checkpoints" / "step-00000007"),
                 None, "--seed", "none")
    assert second["shuffle_seed"] == whole["shuffle_seed"]
    first = {"losses": whole["losses"][:7]}
    assert_same_run(first, second, whole, 7)


def test_bf16_true_checkpoints_save_and_resume(tmp_path):
    whole = leg(tmp_path, tmp_path / "straight", 8, "bf16-true")
    first = leg(tmp_path, tmp_path / "run", 6, "bf16-true")
    second = leg(tmp_path, tmp_path / "run", 8, "bf16-true", "last")
    assert_same_run(first, second, whole, 6, atol=0)  # bfloat16 weights come back bit for bit


def test_a_partial_accumulation_group_is_saved_and_resumed_exactly(tmp_path):
    # 3 batches per optimizer step; stop after batch 7 (two full groups and one batch of the third).
    whole = leg(tmp_path, tmp_path / "straight", 5, "32-true", "-", None, "--accumulate", "3")
    first = leg(tmp_path, tmp_path / "run", 5, "32-true", "-", None, "--accumulate", "3",
                "--save-and-stop-at-batch", "7")
    assert first["step"] == 2 and len(first["losses"]) == 7
    second = leg(tmp_path, tmp_path / "run", 5, "32-true", "last", None, "--accumulate", "3")
    assert len(first["losses"]) + len(second["losses"]) == len(whole["losses"])
    assert_same_run(first, second, whole, 2)
