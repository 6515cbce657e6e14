"""A restore on JAX on a CPU: the arrays read from a local checkpoint and given away become the variables' memory (no
copy), a user's own arrays never do, and training on after it neither writes into that memory nor trains off the
straight run.

Runs in the JAX session.
"""

from __future__ import annotations

import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import find_checkpoint
from tests.helpers import Regressor, regression_data

pytestmark = [pytest.mark.jax_only,  # the loading runs have no ModelCheckpoint: its saved state is ignored
              pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state for callbacks")]

ARGS = {"batch_size": 16, "logger": False, "enable_progress_bar": False}


class LoadsItself(kt.callbacks.Callback):
    """Loads a state at fit start, keeps it, and records whether each model variable uses its array's memory."""

    def __init__(self, state, copy: bool = True):
        self.state, self.copy, self.shared = state, copy, None

    def on_fit_start(self, trainer, module):
        trainer.load_state_dict(self.state, copy=self.copy)
        self.shared = [np.shares_memory(np.asarray(variable.value), saved)
                       for variable, saved in zip(module.model.variables, self.state["model"].values(), strict=True)]


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A writable copy on a 64-byte boundary: memory XLA on a CPU would take as it is."""
    raw = np.empty(array.nbytes + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    copy = raw[skip:skip + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def saved_run(tmp_path):
    kt.Trainer(max_steps=3, default_root_dir=str(tmp_path / "run"), **ARGS).fit(
        Regressor(optimizer="adam"), train_data=regression_data())
    return str(tmp_path / "run" / "checkpoints" / "step-00000003")


def test_a_local_restore_uses_the_read_arrays_in_place_and_training_on_leaves_them_untouched(tmp_path):
    url = saved_run(tmp_path)
    loader = LoadsItself(find_checkpoint(url, str(tmp_path), {}).state, copy=False)
    resumed = kt.Trainer(max_steps=6, enable_checkpointing=False, callbacks=[loader], **ARGS)
    resumed.fit(Regressor(optimizer="adam"), train_data=regression_data())
    assert all(loader.shared)  # the kernel and the bias: no copy into XLA's memory
    fresh = find_checkpoint(url, str(tmp_path), {}).state
    for kept, read_again in zip(loader.state["model"].values(), fresh["model"].values(), strict=True):
        np.testing.assert_array_equal(kept, read_again)  # three donated steps later, the memory holds step 3
    straight = kt.Trainer(max_steps=6, default_root_dir=str(tmp_path / "run"), **ARGS)
    straight_module = Regressor(optimizer="adam")
    straight.fit(straight_module, train_data=regression_data(), ckpt_path=url)
    for ours, expected in zip(resumed.module.model.get_weights(), straight_module.model.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, expected)


class OverwritesAfterLoading(LoadsItself):
    """Loads the user's arrays, then overwrites them, recording the weights before and after."""

    def on_fit_start(self, trainer, module):
        super().on_fit_start(trainer, module)
        self.before = module.model.get_weights()
        for array in self.state["model"].values():
            array[...] = 1e6
        self.after = module.model.get_weights()


@pytest.mark.parametrize("own", [True, False], ids=["own arrays", "a restore's arrays"])
def test_arrays_not_given_away_are_copied_so_changing_them_later_changes_no_weight(tmp_path, own):
    url = saved_run(tmp_path)
    state = find_checkpoint(url, str(tmp_path), {}).state
    if own:
        state["model"] = {key: aligned_copy(array) for key, array in state["model"].items()}
    loader = OverwritesAfterLoading(state)
    kt.Trainer(max_steps=4, enable_checkpointing=False, callbacks=[loader], **ARGS).fit(
        Regressor(optimizer="adam"), train_data=regression_data())
    assert not any(loader.shared)
    for after, before in zip(loader.after, loader.before, strict=True):
        np.testing.assert_array_equal(after, before)
