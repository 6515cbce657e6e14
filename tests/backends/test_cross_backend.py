"""Checkpoints move between engines: a run saved on TensorFlow resumes on JAX, and one saved on JAX on TensorFlow;
both engines log the same TensorBoard tags at the same steps.

The model has no dropout, so both engines compute the same function: the continued run ends within
1e-5 of a run that stayed on one backend (the engines' kernels differ in the last bits). This
process runs TensorFlow; the JAX legs run in a fresh process that refuses TensorFlow (the ones TensorFlow
resumes started as collection ends, tests/early.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.backends.leg_run import leg
from tests.backends.runs import LEG_RUN, StartedLegs, jax_legs, max_difference, start_legs
from tests.helpers import read_scalars

LOGGED = {"max_steps": 6, "logger": True}


@pytest.fixture(scope="module")
def tensorflow_to_jax(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """TensorFlow legs here, then one JAX process resuming two of them and logging a run to TensorBoard."""
    folder = tmp_path_factory.mktemp("tensorflow-to-jax")
    runs = {"stayed": leg({"root": str(folder / "stayed"), "max_epochs": 2}),
            "stayed16": leg({"root": str(folder / "stayed16"), "max_epochs": 2, "precision": "16-mixed"}),
            "first": leg({"root": str(folder / "moved"), "max_steps": 10}),
            "first16": leg({"root": str(folder / "moved16"), "max_steps": 10, "precision": "16-mixed"}),
            "logged": leg({"root": str(folder / "logged-tensorflow"), **LOGGED})}
    runs["moved"], runs["moved16"], runs["logged_jax"] = jax_legs(
        [{"root": str(folder / "moved"), "max_epochs": 2, "ckpt": "last"},
         {"root": str(folder / "moved16"), "max_epochs": 2, "ckpt": "last", "precision": "16-mixed"},
         {"root": str(folder / "logged-jax"), **LOGGED}], folder)
    return folder, runs


def test_a_tensorflow_checkpoint_resumes_on_jax_as_if_it_had_stayed(tensorflow_to_jax):
    _, runs = tensorflow_to_jax
    stayed, stayed16, first, moved, moved16 = (runs[name] for name in ("stayed", "stayed16", "first", "moved",
                                                                      "moved16"))
    assert first["step"] == 10 and moved["step"] == stayed["step"] == 24
    assert moved["backend"] == "jax" and not moved["tensorflow_imported"]
    assert moved["losses"][0][0] == 11  # the data position came along
    assert max_difference(moved["weights"], stayed["weights"]) < 1e-5
    # Under 16-mixed the loss scale and its skip count came along too (float16 kernels differ more in the last bits).
    assert moved16["loss_scale"] == stayed16["loss_scale"] and moved16["skipped"] == stayed16["skipped"]
    assert max_difference(moved16["weights"], stayed16["weights"]) < 1e-4


def test_tensorboard_gets_the_same_tags_and_steps_on_jax_as_on_tensorflow(tensorflow_to_jax):
    folder, runs = tensorflow_to_jax
    assert runs["logged_jax"]["backend"] == "jax" and not runs["logged_jax"]["tensorflow_imported"]
    on_jax = read_scalars(str(folder / "logged-jax" / "tensorboard" / "version_0"))
    on_tensorflow = read_scalars(str(folder / "logged-tensorflow" / "tensorboard" / "version_0"))
    assert on_tensorflow and set(on_jax) == set(on_tensorflow)
    for tag, points in on_tensorflow.items():
        assert [step for step, _ in on_jax[tag]] == [step for step, _ in points], tag


def start_jax_legs(folder: Path) -> StartedLegs:
    """A start (tests/early.py): the JAX legs whose checkpoints TensorFlow resumes."""
    return start_legs([{"root": str(folder / "stayed"), "max_epochs": 2},
                       {"root": str(folder / "moved"), "max_steps": 10},
                       {"root": str(folder / "sharded"), "max_steps": 10, "strategy": "fsdp", "devices": 4,
                        "batch_size": 2, "fsdp_min_bytes": 0}], folder, LEG_RUN, backend="jax")


@pytest.mark.starts_early(start=start_jax_legs)
def test_a_jax_checkpoint_resumes_on_tensorflow_as_if_it_had_stayed(started):
    legs = started(start_jax_legs)
    stayed, first, _ = legs.result()
    tmp_path = legs.cwd
    moved = leg({"root": str(tmp_path / "moved"), "max_epochs": 2, "ckpt": "last"})
    # Saved sharded over 4 devices (each variable as its slices), resumed unsharded on TensorFlow.
    unsharded = leg({"root": str(tmp_path / "sharded"), "max_epochs": 2, "ckpt": "last"})
    assert "__sliced__" in next((tmp_path / "sharded" / "checkpoints" / "step-00000010").glob("trainer.*")).read_text()
    assert unsharded["step"] == 24 and unsharded["losses"][0][0] == 11
    assert max_difference(unsharded["weights"], stayed["weights"]) < 1e-5
    assert first["step"] == 10 and moved["step"] == stayed["step"] == 24
    assert moved["backend"] == "tensorflow" and moved["losses"][0][0] == 11
    assert max_difference(moved["weights"], stayed["weights"]) < 1e-5
    np.testing.assert_allclose([v for _, v in moved["losses"]], [v for _, v in stayed["losses"][10:]], rtol=0,
                               atol=1e-5)
