"""The JAX engine's own parts: one device takes numpy as it is; several split a global batch along its rows (stacked
batches along their second axis), or hold it whole on every device when it does not divide evenly, so every result
is exact without padding; what it reports of the machine.

Runs in the JAX session (4 virtual CPU devices); the engine's training and evaluation are test_jax_engine.py's.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from ktrainer.backends.jax.devices import plan_devices
from ktrainer.backends.jax.engine import JaxEngine, compute_capability, shape_spec, to_host

pytestmark = pytest.mark.jax_only


def engine(devices: int) -> JaxEngine:
    started = JaxEngine(plan_devices(devices=devices))
    started.start()
    return started


def rows_per_device(array: jax.Array) -> list[int]:
    return sorted(shard.data.shape[0] for shard in array.addressable_shards)


def test_one_device_runs_without_a_distribution_and_takes_numpy_as_it_is():
    one = engine(1)
    assert (one.strategy, one.replicas, one.strategy_name()) == (None, 1, "one_device")
    batch = (np.ones((8, 3), np.float32), np.zeros((8,), np.int32))
    assert one.place(batch) is batch
    with one.scope():
        pass


def test_several_devices_split_a_global_batch_along_its_rows_exactly():
    four = engine(4)
    assert four.replicas == 4 and four.strategy_name() == "data_parallel"
    assert four.strategy.device_mesh.devices.size == 4
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    placed = four.place({"x": x})["x"]
    assert placed.sharding.spec == PartitionSpec("batch")
    assert rows_per_device(placed) == [2, 2, 2, 2]
    np.testing.assert_array_equal(to_host(placed), x)


def test_a_batch_that_does_not_divide_evenly_is_held_whole_on_every_device():
    four = engine(4)
    x = np.arange(6, dtype=np.float32)
    placed = four.place(x)
    assert placed.sharding.spec == PartitionSpec()
    assert rows_per_device(placed) == [6, 6, 6, 6]
    np.testing.assert_array_equal(to_host(placed), x)


def test_stacked_batches_are_split_along_their_second_axis():
    four = engine(4)
    stacked = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)  # 3 batches of 8 for one scanned call
    placed = four.place(stacked, stacked=True)
    assert placed.sharding.spec == PartitionSpec(None, "batch")
    assert sorted(shard.data.shape for shard in placed.addressable_shards) == [(3, 2)] * 4
    np.testing.assert_array_equal(to_host(placed), stacked)


def test_shape_specs_carry_the_sharding_place_would_give():
    four = engine(4)
    spec = shape_spec({"x": np.zeros((8, 5), np.float16), "y": np.zeros((8,), np.int32)})
    assert (spec["x"].shape, spec["x"].dtype, spec["y"].dtype) == ((8, 5), np.float16, np.int32)
    placed = four.place_spec(spec)
    assert placed["x"].sharding.spec == PartitionSpec("batch")
    assert four.place_spec(shape_spec(np.zeros((6,)))).sharding.spec == PartitionSpec()


def test_on_a_cpu_there_is_no_accelerator_to_report_and_memory_is_the_process_peak():
    one = engine(1)
    accelerators = one.visible_accelerators()
    assert (accelerators.gpus, accelerators.tpus) == ((), 0)
    assert one.device_name() is None
    peak, what = one.peak_memory()
    assert peak is None or peak > 0
    assert "allocator" not in what


def test_tf32_is_reported_as_jax_configures_matmul_precision():
    one = engine(1)
    before = jax.config.jax_default_matmul_precision
    try:
        jax.config.update("jax_default_matmul_precision", "highest")
        assert not one.tf32_enabled()
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")
        assert one.tf32_enabled()
    finally:
        jax.config.update("jax_default_matmul_precision", before)


@pytest.mark.parametrize(("capability", "parsed"), [("9.0", (9, 0)), ("8.6", (8, 6)), (None, (0, 0)), ("", (0, 0))])
def test_a_gpus_compute_capability_is_read_as_two_numbers(capability, parsed):
    class Device:
        compute_capability = capability

    assert compute_capability(Device()) == parsed
