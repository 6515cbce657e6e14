"""Several replicas on logical CPUs: the same losses as one device, one skip decision, exact metrics.

The checks run in one subprocess with 4 logical CPU devices (a TensorFlow process has one device
layout), started as collection ends so that it runs while the tests before these do (tests/early.py);
this module asserts on what it reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.early import StartedProcess

RUNNER = Path(__file__).with_name("multi_device_run.py")


def start_runner(folder: Path) -> StartedProcess:
    """A start (tests/early.py): multi_device_run.py, in a process of its own."""
    return StartedProcess([sys.executable, str(RUNNER)], folder)


pytestmark = pytest.mark.starts_early(start=start_runner)


@pytest.fixture(scope="module")
def results(started):
    return started(start_runner).result()


@pytest.mark.parametrize("loss_kind", ["keras_losses", "ops"])
def test_four_devices_give_the_losses_and_weights_of_one(results, loss_kind):
    one, four = results[loss_kind]["1"], results[loss_kind]["4"]
    assert len(one["losses"]) == len(four["losses"]) == 24
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=0, atol=1e-5)
    for a, b in zip(one["weights"], four["weights"], strict=True):
        np.testing.assert_allclose(np.array(b), np.array(a), rtol=0, atol=1e-5)
    assert one["losses"][-1] < 0.8 * one["losses"][0]  # it trained
    assert one["global_batch"] == four["global_batch"] == 32


def test_keras_loss_objects_and_raw_means_agree(results):
    np.testing.assert_allclose(results["keras_losses"]["4"]["losses"], results["ops"]["4"]["losses"], atol=1e-6)


def test_logged_values_are_means_over_all_replicas(results):
    assert results["ops"]["4"]["x_mean"] == pytest.approx(results["ops"]["1"]["x_mean"], abs=1e-6)


def test_a_non_finite_gradient_on_one_replica_skips_the_step_on_both(results):
    skip = results["skip"]
    assert skip["replicas"] == 2
    snapshots = skip["snapshots"]
    assert [s["skipped"] for s in snapshots] == [0, 0, 0, 1]
    assert [s["scale"] for s in snapshots] == [1024.0, 1024.0, 1024.0, 512.0]
    for variable_before, variable_after in zip(snapshots[2]["per_device"], snapshots[3]["per_device"], strict=True):
        assert variable_after == variable_before  # bit-identical on every replica
        assert variable_after[0] == variable_after[1]  # and the replicas agree


def test_lr_scaling(results):
    rates = results["lr"]
    assert rates["None"] == pytest.approx(0.2)
    assert rates["sqrt"] == pytest.approx(0.2 * 2)
    assert rates["linear"] == pytest.approx(0.2 * 4)
    assert rates["schedule_linear_after_2_steps"] == pytest.approx(0.1 * 0.5**2 * 4)


def test_validation_is_exact_over_an_uneven_last_batch(results):
    validation = results["validation"]
    assert validation["metrics"]["val/x_sum_mean"] == pytest.approx(validation["expected_x_sum_mean"], abs=1e-6)
    assert validation["metrics"]["val/loss"] == pytest.approx(validation["expected_loss"], rel=1e-6)


def test_asking_for_more_devices_than_exist_names_what_is_there(results):
    assert results["logical_cpus"] == 4
    for asked, message in results["errors"].items():
        assert "TensorFlow has already initialized its devices with 4" in message, asked


def test_data_smaller_than_one_global_batch_is_an_error_naming_the_sizes(results):
    message = results["zero_steps"]
    for words in ("0 training batches", "40 examples", "global batch 64", "batch_size=16 per device x 4 replicas",
                  "smaller batch_size"):
        assert words in message, message
