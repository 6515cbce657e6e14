"""The JAX training step as a pure function of the training state: one call is one SGD step computed by hand, the
Keras variables are untouched while the state is live and hold it once synced, what is assigned to them between
calls is what the next call trains on, and a partial accumulation group is counted, saved, restored and flushed.

Runs in the JAX session; whole fits on the JAX engine are test_jax_engine.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

from ktrainer.backends.jax.devices import plan_devices
from ktrainer.backends.jax.engine import JaxEngine
from ktrainer.step.outputs import APPLIED, BATCH_SIZE, SKIPPED
from tests.backends.train_step_checks import (
    LR,
    PreparedStep,
    check_a_saved_group_restores_and_flushes_as_its_mean,
    sgd_from_zero,
)

pytestmark = pytest.mark.jax_only


class Prepared(PreparedStep):
    """A Regressor prepared on one JAX device; `call` runs the pure step on the live state."""

    def __init__(self, accumulate: int = 1) -> None:
        super().__init__(JaxEngine(plan_devices()), accumulate=accumulate)

    def call(self, batch=None, index: int = 0) -> dict[str, float]:
        """One pure call on the live state; the state stays live (as between compiled executions)."""
        big, small = self.step.read_state()
        big, small, vector = self.step(big, small, batch or (self.x, self.y), np.int32(index))
        self.step.big = big
        self.step.write_small(small)
        return dict(zip(self.keys, np.asarray(vector).tolist(), strict=True))


def test_one_call_is_one_sgd_step_and_reports_its_loss_and_bookkeeping():
    prepared = Prepared()
    assert prepared.keys == ["train/loss", BATCH_SIZE, APPLIED, SKIPPED]
    outputs = prepared.call()
    assert outputs["train/loss"] == pytest.approx(float(np.mean(prepared.y**2)), rel=1e-6)
    assert (outputs[BATCH_SIZE], outputs[APPLIED], outputs[SKIPPED]) == (8.0, 1.0, 0.0)
    live_kernel = np.asarray(prepared.step.big[0][0])
    np.testing.assert_allclose(live_kernel, sgd_from_zero(prepared.x, prepared.y), rtol=1e-5, atol=1e-7)


def test_the_variables_are_stale_while_the_state_is_live_and_hold_it_once_synced():
    prepared = Prepared()
    prepared.call()
    assert not np.any(prepared.kernel())  # still the initial zeros: the step's state is its own
    prepared.engine.sync()
    assert prepared.step.big is None
    np.testing.assert_allclose(prepared.kernel(), sgd_from_zero(prepared.x, prepared.y), rtol=1e-5, atol=1e-7)
    assert int(prepared.step.rules[0].optimizer.iterations.value) == 1


def test_what_is_assigned_between_calls_is_what_the_next_call_trains_on():
    prepared = Prepared()
    prepared.call()
    prepared.engine.sync()
    for variable in prepared.module.model.layers[-1].weights:  # e.g. a callback restoring the initial weights
        variable.assign(np.zeros(variable.shape, np.float32))
    prepared.call()
    prepared.engine.sync()
    np.testing.assert_allclose(prepared.kernel(), sgd_from_zero(prepared.x, prepared.y), rtol=1e-5, atol=1e-7)


def test_a_partial_accumulation_group_is_counted_saved_restored_and_flushed():
    prepared = Prepared(accumulate=3)
    assert prepared.call((prepared.x[:4], prepared.y[:4]))[APPLIED] == 0.0
    assert prepared.call((prepared.x[4:], prepared.y[4:]), 1)[APPLIED] == 0.0
    check_a_saved_group_restores_and_flushes_as_its_mean(prepared, lambda: Prepared(accumulate=3))


def test_a_module_whose_variables_hold_other_weights_trains_from_them():
    prepared = Prepared()
    start = np.arange(4, dtype=np.float32)[:, None]
    prepared.module.model.layers[-1].kernel.assign(start)
    prepared.engine.reload()
    prepared.call()
    prepared.engine.sync()
    prediction = prepared.x @ start[:, 0]
    gradient = 2.0 * prepared.x.T @ (prediction - prepared.y) / len(prepared.y)
    np.testing.assert_allclose(prepared.kernel(), start - LR * gradient[:, None], rtol=1e-5, atol=1e-6)
