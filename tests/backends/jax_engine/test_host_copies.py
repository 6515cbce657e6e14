"""Snapshots of JAX state for a checkpoint: on a CPU a copy (reading a CPU array gives a view of its own buffer); on an
accelerator the copy to the host alone (no second copy), with every array's transfer started before the first read.

Runs in the JAX session. No accelerator runs here, so its arrays are played by `DeviceArray`, which has the
surface ktrainer reads of a `jax.Array` (`devices()`, `is_fully_addressable`, `copy_to_host_async`).
"""

from __future__ import annotations

import jax
import keras
import numpy as np
import pytest

from ktrainer.checkpoint.variables import read_value, start_host_copies

pytestmark = pytest.mark.jax_only


class Device:
    def __init__(self, platform: str):
        self.platform = platform


class DeviceArray:
    """An array on a device of `platform`: counts the host copies started, and hands out one host buffer."""

    def __init__(self, values, platform: str = "gpu", fully_addressable: bool = True):
        self.host = np.asarray(values, np.float32)
        self.platform, self.is_fully_addressable = platform, fully_addressable
        self.copies_started = 0

    def devices(self):
        return {Device(self.platform)}

    def copy_to_host_async(self):
        self.copies_started += 1

    def __array__(self, dtype=None, copy=None):
        return self.host


class Variable:
    """What ktrainer reads of a Keras variable on JAX: its `value`."""

    def __init__(self, value):
        self.value = value


def test_a_cpu_snapshot_is_a_copy_and_keeps_its_values_after_a_donated_update():
    variable = keras.Variable(np.ones((64, 64), np.float32))
    snapshot = read_value(variable)
    assert not np.shares_memory(snapshot, np.asarray(variable.value))  # not a view of the array's own buffer
    variable.assign(jax.jit(lambda w: w * 3.0, donate_argnums=0)(variable.value))
    np.testing.assert_array_equal(snapshot, np.ones((64, 64), np.float32))
    np.testing.assert_array_equal(read_value(variable), np.full((64, 64), 3.0, np.float32))


def test_an_accelerator_snapshot_is_the_copy_to_the_host_alone():
    array = DeviceArray([1.0, 2.0])
    for value in (array, Variable(array)):
        snapshot = read_value(value)
        assert np.shares_memory(snapshot, array.host)
        np.testing.assert_array_equal(snapshot, [1.0, 2.0])


def test_arrays_on_a_cpu_or_spread_over_processes_are_copied_as_before():
    for array in (DeviceArray([1.0], platform="cpu"), DeviceArray([1.0], fully_addressable=False)):
        snapshot = read_value(Variable(array))
        assert not np.shares_memory(snapshot, array.host)
        start_host_copies({"weights": [Variable(array)]})
        assert array.copies_started == 0


def test_every_accelerator_array_in_a_state_starts_its_host_copy_once_before_any_read():
    arrays = [DeviceArray([float(n)]) for n in range(4)]
    state = {"model": {"00000:dense/kernel": Variable(arrays[0]), "00001:dense/bias": arrays[1]},
             "optimizer": [Variable(arrays[2]), (arrays[3], "not an array", 7)], "progress": {"global_step": 3}}
    assert start_host_copies(state) is state
    assert [array.copies_started for array in arrays] == [1, 1, 1, 1]
