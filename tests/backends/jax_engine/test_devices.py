"""The JAX engine's device plan: the Trainer's device arguments read against `jax.devices()`, every mistake refused
with a message that names what is there and how to fix it, and several nodes refused without a coordinator.

Runs in the JAX session, which starts JAX with 4 virtual CPU devices (tests/conftest.py).
"""

from __future__ import annotations

import jax
import pytest

from ktrainer.backends.jax.devices import (
    COORDINATOR,
    NUM_PROCESSES,
    PROCESS_ID,
    JaxDevicePlan,
    joins_processes,
    plan_devices,
)

pytestmark = pytest.mark.jax_only


def test_by_default_one_cpu_device_in_one_process():
    plan = plan_devices()
    assert plan == JaxDevicePlan("cpu", (0,), "one_device", 1)
    assert plan.devices == ("cpu:0",)
    assert plan.jax_devices() == [jax.local_devices()[0]]
    assert plan.is_chief


@pytest.mark.parametrize(("devices", "ids"), [(2, (0, 1)), (4, (0, 1, 2, 3)), ([3, 1], (3, 1))])
def test_several_devices_are_data_parallel_over_the_chosen_local_devices(devices, ids):
    plan = plan_devices(devices=devices, strategy="auto")
    assert (plan.accelerator, plan.device_ids, plan.strategy) == ("cpu", ids, "data_parallel")
    local = jax.local_devices()
    assert plan.jax_devices() == [local[i] for i in ids]
    assert plan.devices == tuple(f"cpu:{i}" for i in ids)


def test_one_device_by_name_and_data_parallel_by_name():
    assert plan_devices(devices=1, strategy="one_device").strategy == "one_device"
    assert plan_devices(devices=[2], strategy="data_parallel").device_ids == (2,)


def test_more_cpu_devices_than_jax_started_with_is_refused_with_the_way_out():
    started = len(jax.local_devices())  # JAX is running from here on
    with pytest.raises(ValueError) as caught:
        plan_devices(devices=started + 4)
    message = str(caught.value)
    for words in (f"needs {started + 4} virtual CPU devices", f"already started with {started}",
                  "Create the Trainer before", f"--xla_force_host_platform_device_count={started + 4}"):
        assert words in message


@pytest.mark.parametrize(("arguments", "words"), [
    ({"accelerator": "fpga"}, "accelerator"),
    ({"accelerator": "gpu"}, "accelerator='gpu', but JAX runs on 'cpu'"),
    ({"accelerator": "tpu"}, "Install jax with tpu support"),
    ({"strategy": "tpu"}, "strategy"),
    ({"strategy": object()}, "needs KERAS_BACKEND=tensorflow"),
    ({"strategy": "one_device", "devices": 2}, "strategy='one_device' conflicts with devices=2 (2 devices)"),
    ({"devices": 0}, "must be >= 1"),
    ({"devices": [1, 1]}, "repeats an index"),
    ({"num_nodes": 0}, "num_nodes"),
])
def test_a_wrong_or_conflicting_argument_is_refused_naming_it(arguments, words):
    with pytest.raises(ValueError) as caught:
        plan_devices(**arguments)
    assert words in str(caught.value)


def test_several_nodes_without_a_coordinator_are_refused_rather_than_training_alone(monkeypatch):
    monkeypatch.delenv(COORDINATOR, raising=False)
    with pytest.raises(ValueError) as caught:
        plan_devices(num_nodes=2)
    message = str(caught.value)
    for words in ("num_nodes=2", COORDINATOR, "would train alone", "ktrainer launch --nodes 2", "docs/distributed.md"):
        assert words in message
    assert not jax.distributed.is_initialized()


def test_a_process_count_that_disagrees_with_num_nodes_is_refused_before_joining(monkeypatch):
    monkeypatch.setenv(COORDINATOR, "127.0.0.1:1")  # never contacted: the check comes first
    monkeypatch.setenv(NUM_PROCESSES, "3")
    monkeypatch.setenv(PROCESS_ID, "0")
    with pytest.raises(ValueError, match=f"num_nodes=2, but {NUM_PROCESSES}=3. Make them agree."):
        plan_devices(num_nodes=2)
    assert not jax.distributed.is_initialized()


LAUNCHED = {COORDINATOR: "127.0.0.1:1234", NUM_PROCESSES: "2", PROCESS_ID: "1"}


@pytest.mark.parametrize(("num_nodes", "strategy", "environ", "joins"), [
    (1, "auto", {}, False),
    (2, "auto", {}, True),
    (1, "multi_worker", {}, True),
    (1, "auto", LAUNCHED, True),  # `ktrainer launch --nodes 2 -- ktrainer fit ...`, no num_nodes in the script
    (1, "data_parallel", LAUNCHED, True),
    (1, "auto", {**LAUNCHED, NUM_PROCESSES: "1"}, False),
    (1, "auto", {NUM_PROCESSES: "2"}, False),  # no coordinator named: not started by a launcher
])
def test_a_process_joins_the_others_when_asked_or_when_a_launcher_started_several(num_nodes, strategy, environ, joins):
    assert joins_processes(num_nodes, strategy, environ) is joins


def test_one_device_in_a_launched_group_is_refused_before_joining(monkeypatch):
    for name, value in LAUNCHED.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="strategy='one_device' conflicts with several processes"):
        plan_devices(strategy="one_device")
    assert not jax.distributed.is_initialized()


@pytest.mark.parametrize("process_id", [None, "two", "2"])
def test_a_missing_or_impossible_process_id_is_refused_before_joining(monkeypatch, process_id):
    monkeypatch.setenv(COORDINATOR, "127.0.0.1:1")  # never contacted: the check comes first
    monkeypatch.setenv(NUM_PROCESSES, "2")
    if process_id is None:
        monkeypatch.delenv(PROCESS_ID, raising=False)
    else:
        monkeypatch.setenv(PROCESS_ID, process_id)
    with pytest.raises(ValueError, match=f"{PROCESS_ID}=.*each of the 2 processes needs its own id, 0 to 1"):
        plan_devices(num_nodes=2)
    assert not jax.distributed.is_initialized()
