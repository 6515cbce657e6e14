"""Snapshots of JAX state for a checkpoint: on a CPU a copy (reading a CPU array gives a view of its own buffer); on an
accelerator the copy to the host alone (no second copy), with every array's transfer started before the first read;
a background save's copies go into host memory the next background save reuses.

Runs in the JAX session. No accelerator runs here, so its arrays are played by `DeviceArray`, which has the
surface ktrainer reads of a `jax.Array` (`devices()`, `is_fully_addressable`, `copy_to_host_async`).
"""

from __future__ import annotations

import jax
import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import find_checkpoint
from ktrainer.checkpoint.host_buffers import HostBuffers
from ktrainer.checkpoint.variables import read_value, start_host_copies
from tests.helpers import Regressor, regression_data

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


def test_a_background_snapshot_reuses_the_last_ones_host_memory_and_keeps_its_values():
    variable = keras.Variable(np.ones((64, 64), np.float32))
    accelerator = DeviceArray([1.0, 2.0])
    buffers = HostBuffers()
    first = buffers.reader()
    snapshot, read_as_is = first(variable), first(accelerator)
    assert not snapshot.flags.writeable and not np.shares_memory(snapshot, np.asarray(variable.value))
    assert np.shares_memory(read_as_is, accelerator.host)  # its copy to the host is the snapshot: no buffer
    variable.assign(jax.jit(lambda w: w * 3.0, donate_argnums=0)(variable.value))
    np.testing.assert_array_equal(snapshot, np.ones((64, 64), np.float32))
    again = buffers.reader()(variable)  # the next save, once the one holding `snapshot` is written
    assert np.shares_memory(again, snapshot)
    np.testing.assert_array_equal(again, np.full((64, 64), 3.0, np.float32))
    other = buffers.reader()(keras.Variable(np.ones((8,), np.float32)))  # another shape: a buffer of its own
    assert other.shape == (8,) and not np.shares_memory(other, again)


def test_async_saves_every_step_hold_each_steps_weights_though_they_share_host_memory(tmp_path):
    class Weights(kt.callbacks.Callback):
        def __init__(self):
            self.at_step = {}

        def on_train_batch_end(self, trainer, module, outputs, batch_idx):
            self.at_step[trainer.global_step] = [np.array(w) for w in module.model.get_weights()]

    seen = Weights()
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=1, max_to_keep=None, save_last=False,
                                              async_save=True)
    trainer = kt.Trainer(max_steps=5, batch_size=16, default_root_dir=str(tmp_path), logger=False,
                         enable_progress_bar=False, callbacks=[seen, checkpoint])
    trainer.fit(Regressor(), train_data=regression_data())
    for step in range(1, 6):
        state = find_checkpoint(str(tmp_path / "checkpoints" / f"step-{step:08d}"), str(tmp_path / "checkpoints"),
                                {}).state
        saved = list(state["model"].values())
        assert len(saved) == len(seen.at_step[step])
        for kept, expected in zip(saved, seen.at_step[step], strict=True):
            np.testing.assert_array_equal(np.asarray(kept), expected)
