"""Checkpoints move between engines: a run saved on TensorFlow resumes on JAX, and one saved on JAX on TensorFlow.

The model has no dropout, so both engines compute the same function: the continued run ends within
1e-5 of a run that stayed on one backend (the engines' kernels differ in the last bits). This
process runs TensorFlow; the JAX legs run in a fresh process that refuses TensorFlow.
"""

from __future__ import annotations

import numpy as np

from tests.backends.leg_run import leg
from tests.backends.runs import jax_legs, max_difference


def test_a_tensorflow_checkpoint_resumes_on_jax_as_if_it_had_stayed(tmp_path):
    stayed = leg({"root": str(tmp_path / "stayed"), "max_epochs": 2})
    stayed16 = leg({"root": str(tmp_path / "stayed16"), "max_epochs": 2, "precision": "16-mixed"})
    first = leg({"root": str(tmp_path / "moved"), "max_steps": 10})
    leg({"root": str(tmp_path / "moved16"), "max_steps": 10, "precision": "16-mixed"})
    moved, moved16 = jax_legs([{"root": str(tmp_path / "moved"), "max_epochs": 2, "ckpt": "last"},
                               {"root": str(tmp_path / "moved16"), "max_epochs": 2, "ckpt": "last",
                                "precision": "16-mixed"}], tmp_path)
    assert first["step"] == 10 and moved["step"] == stayed["step"] == 24
    assert moved["backend"] == "jax" and not moved["tensorflow_imported"]
    assert moved["losses"][0][0] == 11  # the data position came along
    assert max_difference(moved["weights"], stayed["weights"]) < 1e-5
    # Under 16-mixed the loss scale and its skip count came along too (float16 kernels differ more in the last bits).
    assert moved16["loss_scale"] == stayed16["loss_scale"] and moved16["skipped"] == stayed16["skipped"]
    assert max_difference(moved16["weights"], stayed16["weights"]) < 1e-4


def test_a_jax_checkpoint_resumes_on_tensorflow_as_if_it_had_stayed(tmp_path):
    stayed, first, _ = jax_legs([{"root": str(tmp_path / "stayed"), "max_epochs": 2},
                                 {"root": str(tmp_path / "moved"), "max_steps": 10},
                                 {"root": str(tmp_path / "sharded"), "max_steps": 10, "strategy": "fsdp", "devices": 4,
                                  "batch_size": 2, "fsdp_min_bytes": 0}], tmp_path)
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
