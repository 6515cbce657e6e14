"""The JAX update rule as pure arithmetic: SGD applied exactly, gradient accumulation (a group's mean, nothing applied
before its end, an epoch-end flush of a partial group), clipping to a global norm, and under a loss scale a
non-finite group skipped with weights and optimizer state bit-identical while the scale moves."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from ktrainer.backends.jax.update_rule import JaxUpdateRule
from ktrainer.precision import MixedPrecision, Precision

pytestmark = pytest.mark.jax_only

START = np.array([1.0, -2.0, 3.0], np.float32)


class Rule:
    """A built rule over one variable with SGD(0.5), and its state as the jitted step carries it."""

    def __init__(self, precision=None, clip=None, accumulate=1, **mixed) -> None:
        precision = precision or Precision()
        self.variable = keras.Variable(START.copy(), name="w")
        optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.5))
        self.rule = JaxUpdateRule(optimizer, [self.variable], precision, clip, accumulate)
        self.rule.build()
        self.values = [self.variable.value]
        self.optimizer_values = [v.value for v in self.rule.optimizer_variables]
        self.accumulation = [v.value for v in self.rule.accumulation_variables]
        self.scale = [v.value for v in self.rule.scale_variables]

    def step(self, gradient, flush: bool = False) -> tuple[bool, bool]:
        """One batch's (unscaled) gradient through the rule; returns (due, skipped) and keeps the new state."""
        arguments = (self.values, self.optimizer_values, self.accumulation, self.scale)
        if flush:
            result = self.rule.flush(*arguments)
        else:
            result = self.rule.update([np.asarray(gradient, np.float32)], *arguments)
        self.values, self.optimizer_values, self.accumulation, self.scale, due, skipped = result
        return bool(due), bool(skipped)

    @property
    def weights(self) -> np.ndarray:
        return np.asarray(self.values[0])

    @property
    def iterations(self) -> int:
        """The optimizer's iteration count, read from the state (its first variable)."""
        return int(self.optimizer_values[0])


def test_one_batch_per_update_applies_sgd_exactly():
    rule = Rule()
    assert rule.step([1.0, 2.0, -4.0]) == (True, False)
    np.testing.assert_array_equal(rule.weights, START - 0.5 * np.array([1.0, 2.0, -4.0], np.float32))
    assert rule.iterations == 1
    np.testing.assert_array_equal(np.asarray(rule.variable.value), START)  # pure: the variable is not assigned


def test_accumulation_applies_the_mean_of_a_group_at_its_end_only():
    rule = Rule(accumulate=3)
    gradients = [[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]]
    assert rule.step(gradients[0]) == (False, False)
    assert rule.step(gradients[1]) == (False, False)
    np.testing.assert_array_equal(rule.weights, START)
    assert rule.iterations == 0 and rule.rule.pending(rule.accumulation[-1]) == 2
    assert rule.step(gradients[2]) == (True, False)
    np.testing.assert_allclose(rule.weights, START - 0.5 * np.ones(3, np.float32), rtol=0, atol=1e-7)
    assert rule.iterations == 1 and rule.rule.pending(rule.accumulation[-1]) == 0
    assert all(not np.any(np.asarray(total)) for total in rule.accumulation[:-1])


def test_an_epoch_end_flush_applies_the_partial_group_as_its_own_mean():
    rule = Rule(accumulate=4)
    rule.step([2.0, 0.0, 0.0])
    rule.step([0.0, 2.0, 0.0])
    assert rule.step(None, flush=True) == (True, False)
    np.testing.assert_allclose(rule.weights, START - 0.5 * np.array([1.0, 1.0, 0.0], np.float32), atol=1e-7)
    assert rule.rule.pending(rule.accumulation[-1]) == 0


def test_gradients_are_clipped_to_the_global_norm():
    rule = Rule(clip=1.0)
    rule.step([0.0, 6.0, 8.0])  # norm 10
    np.testing.assert_allclose(rule.weights, START - 0.5 * np.array([0.0, 0.6, 0.8], np.float32), atol=1e-7)
    small = Rule(clip=100.0)
    small.step([0.0, 6.0, 8.0])
    np.testing.assert_array_equal(small.weights, START - 0.5 * np.array([0.0, 6.0, 8.0], np.float32))


def test_without_loss_scaling_a_non_finite_gradient_is_applied_as_plain_training_would():
    rule = Rule()
    assert rule.step([np.inf, 0.0, 0.0]) == (True, False)
    assert np.isinf(rule.weights[0]) and rule.iterations == 1


def test_under_a_loss_scale_a_non_finite_step_is_skipped_bit_identically_and_the_scale_halves():
    rule = Rule(MixedPrecision("16-mixed", initial_scale=1024.0, growth_interval=2))
    before = [np.asarray(v).copy() for v in rule.optimizer_values]
    assert rule.step([np.nan, 1.0, 1.0]) == (True, True)
    np.testing.assert_array_equal(rule.weights, START)
    for kept, now in zip(before, rule.optimizer_values, strict=True):
        np.testing.assert_array_equal(kept, np.asarray(now))
    assert [float(v) for v in rule.scale] == [512.0, 0.0]
    assert rule.step([1.0, 1.0, 1.0]) == (True, False)
    assert rule.iterations == 1 and [float(v) for v in rule.scale] == [512.0, 1.0]
    rule.step([1.0, 1.0, 1.0])
    assert [float(v) for v in rule.scale] == [1024.0, 0.0]  # the growth interval's finite step doubles it


def test_under_a_loss_scale_with_accumulation_the_scale_moves_once_per_group():
    rule = Rule(MixedPrecision("16-mixed", initial_scale=1024.0), accumulate=2)
    assert rule.step([np.inf, 0.0, 0.0]) == (False, False)  # not yet decided: the group is open
    assert [float(v) for v in rule.scale] == [1024.0, 0.0]
    assert rule.step([1.0, 0.0, 0.0]) == (True, True)  # the group's mean is not finite: skipped as one
    np.testing.assert_array_equal(rule.weights, START)
    assert [float(v) for v in rule.scale] == [512.0, 0.0]
