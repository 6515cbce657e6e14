"""Exact resume: N steps straight equal k steps, then a new process (or Trainer) resuming to N.

The straight runs and every resume that crosses a process boundary run in fresh processes (a
state that lives only in a process would be lost there); legs that only have to write a
checkpoint run in this process, which keeps the suite fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.checkpoint.resume_run import train

pytestmark = pytest.mark.both_backends

RUNNER = Path(__file__).with_name("resume_run.py")
N = 12  # 5 batches per epoch: steps 5 and 10 end epochs


def arguments(root, max_steps, precision, ckpt="-", options=None, *extra) -> list[str]:
    return [str(root), str(max_steps), precision, ckpt, json.dumps(options or {}), *extra]


def leg(cwd, root, max_steps, precision, ckpt="-", options=None, *extra) -> dict:
    """One leg in a fresh process."""
    done = subprocess.run([sys.executable, str(RUNNER), *arguments(root, max_steps, precision, ckpt, options, *extra)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def inline(root, max_steps, precision, ckpt="-", options=None, *extra) -> dict:
    """One leg in this process."""
    return train(arguments(root, max_steps, precision, ckpt, options, *extra))


def weights(result):
    if isinstance(result["weights"], list):
        return result["weights"]
    with np.load(result["weights"]) as loaded:
        return [loaded[name] for name in loaded.files]


def assert_same_run(first, second, whole, atol=1e-6):
    """first + second trained exactly what whole trained: per-step losses, final weights, step and epoch."""
    assert [s for s, _ in second["losses"]][-1] == whole["step"]
    joined = first["losses"] + second["losses"]
    assert [s for s, _ in joined] == [s for s, _ in whole["losses"]]
    np.testing.assert_allclose([v for _, v in joined], [v for _, v in whole["losses"]], rtol=0, atol=atol)
    for resumed, reference in zip(weights(second), weights(whole), strict=True):
        np.testing.assert_allclose(resumed, reference, rtol=0, atol=atol)
    assert (second["step"], second["epoch"]) == (whole["step"], whole["epoch"])


@pytest.fixture(scope="module")
def straight_16(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight-16")
    return leg(folder, folder / "run", N, "16-mixed")


# Each precision at one position in the default run; the other two combinations with -m slow.
@pytest.mark.parametrize(("k", "precision"), [
    pytest.param(5, "32-true", id="epoch-boundary-32-true"),
    pytest.param(7, "16-mixed", id="mid-epoch-16-mixed"),
    pytest.param(7, "32-true", id="mid-epoch-32-true", marks=pytest.mark.slow),
    pytest.param(5, "16-mixed", id="epoch-boundary-16-mixed", marks=pytest.mark.slow),
])
def test_a_new_process_resuming_equals_the_straight_run(request, precision, k, tmp_path):
    whole = request.getfixturevalue("straight_32" if precision == "32-true" else "straight_16")
    first = inline(tmp_path / "run", k, precision)
    assert first["step"] == k
    second = leg(tmp_path, tmp_path / "run", N, precision, "last")
    assert [s for s, _ in second["losses"]] == list(range(k + 1, N + 1))
    assert_same_run(first, second, whole)
    assert second["scale"] == whole["scale"]


@pytest.mark.slow  # the default run resumes seeded runs exactly; this is the drawn-seed variant
def test_seed_none_resumes_exactly_with_the_drawn_shuffle_seed(tmp_path):
    # The straight run draws its own shuffle seed (and initial weights) and checkpoints step 7 on its way
    # to 12; a new process resuming that checkpoint must continue with the same data order.
    whole = inline(tmp_path / "run", N, "32-true", "-", None, "--seed", "none", "--every-n-steps", "7")
    other = inline(tmp_path / "other", 2, "32-true", "-", None, "--seed", "none")
    assert other["shuffle_seed"] != whole["shuffle_seed"]  # really drawn: another run, another order
    second = leg(tmp_path, tmp_path / "resumed", N, "32-true", str(tmp_path / "run" / "checkpoints" / "step-00000007"),
                 None, "--seed", "none")
    assert second["shuffle_seed"] == whole["shuffle_seed"]
    assert_same_run({"losses": whole["losses"][:7]}, second, whole)


@pytest.mark.parametrize("precision", [pytest.param("bf16-true", marks=pytest.mark.slow), "16-true"])
def test_16_bit_true_checkpoints_save_and_resume_bit_for_bit(tmp_path, precision):
    whole = inline(tmp_path / "straight", 8, precision)
    first = inline(tmp_path / "run", 6, precision)
    second = inline(tmp_path / "run", 8, precision, "last")
    assert_same_run(first, second, whole, atol=0)


def test_a_partial_accumulation_group_is_saved_and_resumed_exactly(tmp_path):
    # 3 batches per optimizer step; stop after batch 7 (epoch 0 ends at batch 5, flushing a group of 2;
    # batches 6 and 7 are two thirds of the next group).
    whole = inline(tmp_path / "straight", 5, "32-true", "-", None, "--accumulate", "3")
    first = inline(tmp_path / "run", 5, "32-true", "-", None, "--accumulate", "3", "--save-and-stop-at-batch", "7")
    assert first["step"] == 2 and len(first["losses"]) == 7
    second = inline(tmp_path / "run", 5, "32-true", "last", None, "--accumulate", "3")
    assert_same_run(first, second, whole)
