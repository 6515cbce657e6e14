"""The TensorFlow engine's device plan: the Trainer's device arguments read against the machine, the strategy each plan
makes, who the chief is in a TF_CONFIG cluster, and every mistake refused with a message that says how to fix it.

In-process, on this session's one CPU device; splitting the CPU into several is tested in processes of their own
(test_multi_device.py).
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from ktrainer.backends.tensorflow.devices import DevicePlan, check_cluster_description, plan_devices

pytestmark = pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")),
                                reason="the plans asserted here are those of a machine without a GPU")


def tf_config(task_type: str = "worker", index: int = 0, workers: int = 2, chief: bool = False) -> str:
    """A TF_CONFIG describing `workers` workers (and a chief), seen from one task."""
    cluster = {"worker": [f"127.0.0.1:{2000 + i}" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["127.0.0.1:1999"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    for name in ("TF_CONFIG", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)


def test_by_default_the_first_cpu_under_tensorflows_default_strategy():
    plan = plan_devices()
    assert plan == DevicePlan("cpu", ("/cpu:0",), "one_device")
    assert plan.is_chief
    # the default strategy feeds one device about twice as fast as OneDeviceStrategy (benchmarks/fit_overhead.py)
    assert plan.make_strategy() is tf.distribute.get_strategy()


def test_a_strategy_object_is_used_as_it_is():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    plan = plan_devices(strategy=strategy)
    assert (plan.strategy, plan.custom) == ("custom", strategy)
    assert plan.make_strategy() is strategy


def test_a_named_device_that_is_not_the_first_gets_its_own_strategy():
    strategy = DevicePlan("cpu", ("/cpu:1",), "one_device").make_strategy()
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert strategy.extended.worker_devices[0].endswith("CPU:1")


def test_a_tf_config_cluster_is_planned_as_multi_worker_without_asking(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=3))
    plan = plan_devices()
    assert (plan.strategy, plan.num_nodes) == ("multi_worker", 3)


@pytest.mark.parametrize(("config", "chief"), [
    (tf_config("worker", 0), True), (tf_config("worker", 1), False),
    (tf_config("worker", 0, chief=True), False), (tf_config("chief", 0, chief=True), True),
])
def test_the_chief_is_the_chief_task_else_worker_0(monkeypatch, config, chief):
    monkeypatch.setenv("TF_CONFIG", config)
    assert DevicePlan("cpu", (), "multi_worker", 2).is_chief is chief


def test_one_process_is_always_the_chief_whatever_tf_config_says(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    assert DevicePlan("cpu", ("/cpu:0",), "one_device").is_chief


@pytest.mark.parametrize(("arguments", "words"), [
    ({"accelerator": "fpga"}, "accelerator"),
    ({"accelerator": "gpu"}, "accelerator='gpu', but TensorFlow sees no GPU"),
    ({"accelerator": "tpu"}, "but TensorFlow sees no TPU"),
    ({"strategy": "tpu"}, "but TensorFlow sees no TPU"),
    ({"strategy": "data_parallel"}, "strategy"),
    ({"strategy": "one_device", "devices": 2}, "strategy='one_device' conflicts with devices=2 (2 devices)"),
    ({"devices": 0}, "must be >= 1"),
    ({"num_nodes": 0}, "num_nodes"),
])
def test_a_wrong_or_conflicting_argument_is_refused_naming_it(arguments, words):
    with pytest.raises(ValueError) as caught:
        plan_devices(**arguments)
    assert words in str(caught.value)


def test_several_nodes_without_a_cluster_description_are_refused_rather_than_training_alone(monkeypatch):
    with pytest.raises(ValueError) as caught:
        plan_devices(num_nodes=2)
    message = str(caught.value)
    for words in ("num_nodes=2", "TF_CONFIG is not set", "would train alone", "ktrainer launch --nodes 2"):
        assert words in message
    assert "SLURM job" not in message
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    with pytest.raises(ValueError, match="this is a SLURM job: build TF_CONFIG from SLURM's variables"):
        check_cluster_description(2)


def test_a_cluster_of_another_size_or_a_single_device_strategy_across_nodes_is_refused(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=3))
    with pytest.raises(ValueError, match="num_nodes=2, but TF_CONFIG describes a cluster of 3 tasks"):
        plan_devices(num_nodes=2)
    with pytest.raises(ValueError, match="strategy='mirrored' cannot run on num_nodes=3"):
        plan_devices(strategy="mirrored", num_nodes=3)
