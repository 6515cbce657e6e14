"""Sparse gradients (an Embedding's) train as the math of their gradient on TensorFlow, as on JAX.

Keras 3's TensorFlow optimizers apply an `IndexedSlices` row by row, so a token met twice in a batch
adds the squares of its two rows to Adam's second moment instead of the square of their sum. ktrainer
sums duplicate rows first: a run equals a hand-written TensorFlow step on densified gradients (the
math), the same Module on JAX, and itself on 2 and 4 replicas; the optimizer is still handed a sparse
gradient, one row per index. The model (tests/backends/sparse_run.py) looks up every position of
every example, and 96 tokens a batch from a vocabulary of 40: every batch repeats rows and leaves some untouched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.backends import sparse_run
from tests.backends.runs import SPARSE_RUN, StartedLegs, max_difference, start_legs

OPTIMIZERS = ["adam", "adamw", "adagrad", "rmsprop", "sgd", "adam_ema"]
TABLES = ("tokens", "positions")


def densified_oracle(optimizer_name: str, steps: int = 16, batch_size: int = 16) -> dict:
    """The math: a hand-written TensorFlow step that hands the optimizer every gradient dense."""
    model, optimizer = sparse_run.build_model(), sparse_run.OPTIMIZERS[optimizer_name]()
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = sparse_run.loss_of(model, x, y)
        optimizer.apply([tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)], variables)
        return loss

    x, y = sparse_run.data(steps, batch_size)
    losses = [float(step(x[i:i + batch_size], y[i:i + batch_size])) for i in range(0, len(x), batch_size)]
    optimizer.finalize_variable_values(variables)  # the EMA's weights, as fit's end gives them
    return {"losses": losses, "weights": [np.asarray(w) for w in model.get_weights()]}


VARIANTS = {
    "adam": {"optimizer": "adam"},
    "clipped": {"optimizer": "adam", "clip": 0.05},
    "accumulated": {"optimizer": "adamw", "accumulate": 2},
    "16-mixed": {"optimizer": "adam", "precision": "16-mixed", "initial_scale": 2.0 ** 20},
    "manual": {"optimizer": "rmsprop", "manual": True},
}
DEVICES = (1, 2, 4)


def start_replicas(folder: Path) -> StartedLegs:
    """A start (tests/early.py): every variant on 2 and 4 logical CPUs, in a TensorFlow process of its own (global
    batch 16)."""
    return start_legs([{**arguments, "devices": devices} for arguments in VARIANTS.values() for devices in DEVICES[1:]],
                      folder, SPARSE_RUN, backend="tensorflow")


pytestmark = pytest.mark.starts_early(start=start_replicas)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, started):
    """Each optimizer's run on TensorFlow (this process), the oracle and on JAX; an AdamW run that moved from
    TensorFlow to JAX at step 8; every variant on one device (this process: the "adam" variant is the Adam run) and
    on 2 and 4 logical CPUs (a TensorFlow process of its own, started as collection ended; global batch 16). The
    other processes run while this one trains."""
    folder = tmp_path_factory.mktemp("sparse")
    replicas = started(start_replicas)
    first = sparse_run.leg({"optimizer": "adamw", "root": str(folder / "moved"), "max_steps": 8})
    jax = start_legs([{"optimizer": name} for name in OPTIMIZERS]
                     + [{"optimizer": "adamw", "root": str(folder / "moved"), "ckpt": "last"}],
                     folder, SPARSE_RUN, backend="jax")
    tensorflow = {name: sparse_run.leg({"optimizer": name}) for name in OPTIMIZERS}
    oracle = {name: densified_oracle(name) for name in OPTIMIZERS}
    one = {name: tensorflow["adam"] if name == "adam" else sparse_run.leg(arguments)
           for name, arguments in VARIANTS.items()}
    *on_jax, moved = jax.result()
    done = iter(replicas.result())
    return {"tensorflow": tensorflow, "oracle": oracle, "jax": dict(zip(OPTIMIZERS, on_jax, strict=True)),
            "first": first, "moved": moved,
            "replicas": {name: {1: one[name], **{devices: next(done) for devices in DEVICES[1:]}} for name in VARIANTS}}


def assert_same_run(run: dict, reference: dict, tolerance: float) -> None:
    np.testing.assert_allclose(run["losses"], reference["losses"], rtol=0, atol=tolerance)
    assert max_difference(run["weights"], reference["weights"]) < tolerance


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_tensorflow_trains_the_math_of_a_sparse_gradient(runs, optimizer):
    run = runs["tensorflow"][optimizer]
    assert len(run["losses"]) == 16
    assert_same_run(run, runs["oracle"][optimizer], 1e-6)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_tensorflow_and_jax_train_an_embedding_model_alike(runs, optimizer):
    run = runs["jax"][optimizer]
    assert run["backend"] == "jax" and len(run["losses"]) == 16
    assert_same_run(run, runs["tensorflow"][optimizer], 1e-6)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_optimizer_is_handed_each_tables_gradient_sparse_one_row_per_index(runs, optimizer):
    run = runs["tensorflow"][optimizer]
    tables = {path: calls for path, calls in run["sparse_rows"].items() if path.split("/")[-2] in TABLES}
    assert len(tables) == len(run["sparse_rows"]) == 2, run["sparse_rows"]
    for calls in tables.values():
        assert len(calls) == 16
        assert all(0 < rows == distinct for rows, distinct in calls), calls
    assert any(path.endswith("kernel") for path in run["dense_paths"])


def test_a_tensorflow_checkpoint_of_an_embedding_model_resumes_on_jax_under_adamw(runs):
    first, moved, stayed = runs["first"], runs["moved"], runs["tensorflow"]["adamw"]
    assert first["step"] == 8 and moved["step"] == 16 and moved["backend"] == "jax"
    np.testing.assert_allclose(moved["losses"], stayed["losses"][8:], rtol=0, atol=1e-5)
    assert max_difference(moved["weights"], stayed["weights"]) < 1e-5


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("devices", DEVICES[1:])
def test_several_replicas_train_an_embedding_model_as_one_device(runs, variant, devices):
    one, several = runs["replicas"][variant][1], runs["replicas"][variant][devices]
    assert several["replicas"] == devices and len(several["losses"]) == len(one["losses"]) > 0
    assert_same_run(several, one, 1e-5)
    assert several["skipped"] == one["skipped"] and several["loss_scale"] == one["loss_scale"]
    for run in (one, several):  # each replica's share: still sparse, one row per index
        assert sorted(path.split("/")[-2] for path in run["sparse_rows"]) == sorted(TABLES), run["sparse_rows"]
        assert all(0 < rows == distinct for calls in run["sparse_rows"].values() for rows, distinct in calls)
        assert any(path.endswith("kernel") for path in run["dense_paths"])


@pytest.mark.parametrize(("variant", "optimizer"), [("adam", "adam"), ("manual", "rmsprop")])
@pytest.mark.parametrize("devices", DEVICES[1:])
def test_several_replicas_train_the_math_of_a_sparse_gradient(runs, variant, optimizer, devices):
    # The sum over replicas concatenates their rows: without summing duplicates, N replicas would equal one device
    # and both would be off the math.
    assert_same_run(runs["replicas"][variant][devices], runs["oracle"][optimizer], 1e-5)


def test_the_variants_exercise_what_they_name(runs):
    one = {name: legs[1] for name, legs in runs["replicas"].items()}
    assert max_difference(one["clipped"]["weights"], one["adam"]["weights"]) > 1e-3  # the clip acted
    assert one["16-mixed"]["skipped"] > 0 and one["16-mixed"]["loss_scale"] < 2.0 ** 20
    assert len(one["accumulated"]["losses"]) == 16 and all(
        len(calls) == 8 for calls in one["accumulated"]["sparse_rows"].values())  # one update per two batches
