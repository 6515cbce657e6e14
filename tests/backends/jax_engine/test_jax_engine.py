"""The JAX engine keeps the TensorFlow engine's promises, in the JAX session (a process that refuses TensorFlow).

All legs run once per module, in this process (8 virtual CPU devices); each test asserts one promise. That
TensorBoard gets the same tags and steps on both engines is tests/backends/test_cross_backend.py's to show.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from tests.backends.leg_run import leg
from tests.backends.runs import max_difference

pytestmark = pytest.mark.jax_only

LEGS = {
    "straight": {"root": "straight", "max_epochs": 2},
    "two_devices": {"root": "two", "max_epochs": 2, "devices": 2, "batch_size": 4},
    "four_devices": {"root": "four", "max_epochs": 2, "devices": 4, "batch_size": 2},
    "five_per_execution": {"root": "spe", "max_epochs": 2, "steps_per_execution": 5},
    "first_leg": {"root": "resumed", "max_steps": 10},
    "second_leg": {"root": "resumed", "max_epochs": 2, "ckpt": "last"},
    "skipped": {"root": "skipped", "max_steps": 1, "precision": "16-mixed", "initial_scale": 2.0**40},
    "fp16": {"root": "fp16", "max_epochs": 2, "precision": "16-mixed"},
    "bf16": {"root": "bf16", "max_epochs": 2, "precision": "bf16-mixed"},
    "accumulated": {"root": "accumulated", "max_epochs": 2, "accumulate": 5, "clip": 0.5},
}
TRAINABLE = [0, 1, 2, 3, 6, 7]  # get_weights() order: kernel, bias, gamma, beta, moving mean/variance, kernel, bias


@pytest.fixture(scope="module")
def runs(tmp_path_factory, s3_server):
    cwd = tmp_path_factory.mktemp("jax")
    legs = dict(LEGS)
    bucket = "ktrainer-jax-engine"
    import s3fs

    options = {"client_kwargs": {"endpoint_url": s3_server}, "key": "testing", "secret": "testing"}
    s3fs.S3FileSystem(**options).mkdir(bucket)
    legs["s3_first"] = {"root": f"s3://{bucket}/run", "max_steps": 10, "storage_options": options}
    legs["s3_second"] = {"root": f"s3://{bucket}/run", "max_epochs": 2, "ckpt": "last", "storage_options": options}
    results = {name: leg({**arguments, "root": arguments["root"] if "://" in arguments["root"]
                          else str(cwd / arguments["root"])}) for name, arguments in legs.items()}
    return {**results, "cwd": cwd}


def test_a_jax_run_never_imports_tensorflow(runs):
    # This session's import system refuses TensorFlow (no_tensorflow.py): a run that tried would have failed.
    assert all(not result["tensorflow_imported"] for name, result in runs.items() if name != "cwd")
    assert runs["straight"]["backend"] == "jax" and "tensorflow" not in sys.modules


def test_two_and_four_devices_train_as_one_on_the_same_global_batch(runs):
    for name, replicas in (("two_devices", 2), ("four_devices", 4)):
        assert runs[name]["replicas"] == replicas
        assert max_difference(runs[name]["weights"], runs["straight"]["weights"]) < 1e-5
        np.testing.assert_allclose([v for _, v in runs[name]["losses"]], [v for _, v in runs["straight"]["losses"]],
                                   rtol=0, atol=1e-5)


def test_several_steps_per_execution_train_exactly_as_one(runs):
    assert runs["five_per_execution"]["step"] == runs["straight"]["step"] == 24
    assert max_difference(runs["five_per_execution"]["weights"], runs["straight"]["weights"]) < 1e-6


def test_a_callback_sees_the_weights_of_the_step_it_follows(runs):
    # The state is donated to the jitted step; the Trainer syncs it into the variables before a user's batch hook.
    assert runs["straight"]["seen_weights"] == runs["straight"]["weights"]


def test_a_run_resumed_mid_epoch_continues_exactly(runs):
    first, second, whole = runs["first_leg"], runs["second_leg"], runs["straight"]
    assert first["step"] == 10 and second["step"] == whole["step"]
    joined = first["losses"] + second["losses"]
    assert [s for s, _ in joined] == [s for s, _ in whole["losses"]]
    np.testing.assert_allclose([v for _, v in joined], [v for _, v in whole["losses"]], rtol=0, atol=1e-6)
    assert max_difference(second["weights"], whole["weights"]) < 1e-6


def test_checkpoints_on_s3_resume_exactly(runs):
    assert runs["s3_second"]["step"] == 24
    assert max_difference(runs["s3_second"]["weights"], runs["straight"]["weights"]) < 1e-6


def test_a_skipped_step_leaves_the_weights_bit_identical_and_halves_the_scale(runs):
    skipped = runs["skipped"]
    assert skipped["skipped"] == 1 and skipped["step"] == 1
    assert skipped["loss_scale"] == 2.0**39
    for index in TRAINABLE:
        assert skipped["weights"][index] == skipped["initial_weights"][index]


def test_mixed_precisions_train(runs):
    for name in ("fp16", "bf16"):
        losses = [v for _, v in runs[name]["losses"]]
        assert all(math.isfinite(v) for v in losses) and np.mean(losses[-6:]) < np.mean(losses[:6])
    assert runs["fp16"]["loss_scale"] is not None and runs["bf16"]["loss_scale"] is None


def test_accumulation_applies_a_partial_group_at_each_epoch_end_as_on_tensorflow(runs):
    # 12 batches per epoch in groups of 5: two full groups and a partial one per epoch.
    assert runs["accumulated"]["step"] == 6

