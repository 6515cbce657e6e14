"""The precision plugin interface: "32-true" (`Precision`) computes in float32, never scales the loss, unwraps a
user's LossScaleOptimizer with a warning and always applies the update; the true precisions ("16-true",
"bf16-true", "64-true") set their one dtype; under "16-mixed" `Precision.apply` skips a non-finite step (the update
not run, the scale halved) and runs a finite one (the scale's counter moved)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from ktrainer.precision import MixedPrecision, Precision, TruePrecision
from ktrainer.precision.loss_scale import NoLossScale

pytestmark = pytest.mark.both_backends


def numpy(x) -> np.ndarray:
    """A tensor or variable as a numpy array."""
    return keras.ops.convert_to_numpy(x)


def flag(value: bool):
    """A boolean scalar tensor, as the step gives `apply`."""
    return keras.ops.convert_to_tensor(value)


class Update:
    """An optimizer update of one real variable by a constant gradient, counting its runs."""

    def __init__(self, optimizer, variable: keras.Variable) -> None:
        self.optimizer, self.variable, self.runs = optimizer, variable, 0

    def __call__(self) -> None:
        self.runs += 1
        self.optimizer.apply([keras.ops.ones(self.variable.shape)], [self.variable])


# ----- "32-true" ---------------------------------------------------------------------------------------------------


def test_full_precision_computes_in_float32_without_loss_scaling():
    precision = Precision()
    assert precision.name == "32-true"
    assert precision.policy == "float32" and precision.compute_dtype == "float32"
    assert precision.loss_scaling is False


def test_a_plain_optimizer_is_kept():
    optimizer = keras.optimizers.Adam(0.01)
    precision = Precision()
    assert precision.wrap_optimizer(optimizer) is optimizer
    assert precision.optimizer_to_step(optimizer) is optimizer


def test_a_loss_scale_optimizer_is_unwrapped_with_a_warning_naming_16_mixed():
    inner = keras.optimizers.SGD(0.1)
    with pytest.warns(UserWarning, match="'32-true' needs no loss scaling") as caught:
        unwrapped = Precision().wrap_optimizer(keras.mixed_precision.LossScaleOptimizer(inner))
    assert unwrapped is inner
    assert "precision='16-mixed'" in str(caught[0].message)


def test_the_loss_scale_is_none_and_the_loss_and_gradients_are_unchanged():
    precision, optimizer = Precision(), keras.optimizers.SGD(0.1)
    assert isinstance(precision.loss_scale_of(optimizer), NoLossScale)
    assert precision.loss_scale(optimizer) is None
    loss, gradients = keras.ops.convert_to_tensor(2.5), [keras.ops.ones((2,)), None]
    assert precision.scale_loss(loss, optimizer) is loss
    assert precision.unscale_gradients(gradients, optimizer) is gradients


@pytest.mark.parametrize("finite", [True, False])
def test_full_precision_always_applies_the_update(finite):
    variable = keras.Variable(np.ones(2, "float32"))
    optimizer = keras.optimizers.SGD(0.5)
    optimizer.build([variable])
    update = Update(optimizer, variable)
    skipped = Precision().apply(optimizer, update, flag(finite))
    assert update.runs == 1  # a non-finite gradient is the model's own result, as in plain training
    np.testing.assert_array_equal(numpy(variable), [0.5, 0.5])
    assert keras.backend.standardize_dtype(skipped.dtype) == "float32" and float(numpy(skipped)) == 0.0


def test_full_precision_has_no_state_and_names_itself():
    precision = Precision()
    precision.watch([1, 1, 1], None)  # nothing to check: no error however many steps were skipped
    precision.reset()
    precision.load_state_dict({})
    assert precision.state_dict() == {}
    assert "32-true" in repr(precision) and repr(precision) == "Precision('32-true')"


# ----- the true precisions -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dtype"), [("16-true", "float16"), ("bf16-true", "bfloat16"),
                                             ("64-true", "float64")])
def test_a_true_precision_stores_and_computes_in_its_dtype(name, dtype):
    precision = TruePrecision(name)
    assert precision.name == name
    assert precision.policy == dtype and precision.compute_dtype == dtype
    assert precision.loss_scaling is False
    assert precision.loss_scale(keras.optimizers.SGD(0.1)) is None
    assert repr(precision) == f"TruePrecision({name!r})"


def test_a_true_precision_unwraps_a_loss_scale_optimizer_too():
    inner = keras.optimizers.SGD(0.1)
    with pytest.warns(UserWarning, match="'16-true' needs no loss scaling.*'16-mixed'"):
        assert TruePrecision("16-true").wrap_optimizer(keras.mixed_precision.LossScaleOptimizer(inner)) is inner


@pytest.mark.parametrize("name", ["16-mixed", "32-true", "fp16"])
def test_an_unknown_true_precision_is_refused_with_the_choices(name):
    with pytest.raises(ValueError, match="16-true.*bf16-true.*64-true"):
        TruePrecision(name)


# ----- Precision.apply under "16-mixed" ----------------------------------------------------------------------------

ON_TENSORFLOW_ONLY = pytest.mark.tensorflow_only(
    reason="Precision.apply assigns the loss scale inside keras.ops.cond, the TensorFlow step's path; on JAX "
           "lax.cond traces both branches and the assignment leaks a tracer (the JAX engine moves the scale with "
           "the stateless DynamicLossScale.next_state instead)")


def mixed_update(initial_scale: float = 8.0) -> tuple[MixedPrecision, keras.Optimizer, Update]:
    """A "16-mixed" plugin, its built LossScaleOptimizer and an update of one variable by its inner SGD."""
    precision = MixedPrecision("16-mixed", initial_scale=initial_scale, growth_interval=3)
    variable = keras.Variable(np.ones(2, "float32"))
    optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.5))
    assert isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
    optimizer.build([variable])
    return precision, optimizer, Update(precision.optimizer_to_step(optimizer), variable)


@ON_TENSORFLOW_ONLY
def test_a_non_finite_step_is_skipped_and_halves_the_scale():
    precision, optimizer, update = mixed_update(initial_scale=8.0)
    skipped = precision.apply(optimizer, update, flag(False))
    assert float(numpy(skipped)) == 1.0 and keras.backend.standardize_dtype(skipped.dtype) == "float32"
    assert update.runs == 0
    np.testing.assert_array_equal(numpy(update.variable), [1.0, 1.0])
    assert int(numpy(update.optimizer.iterations)) == 0
    assert float(numpy(optimizer.dynamic_scale)) == 4.0 and int(numpy(optimizer.step_counter)) == 0
    assert float(precision.loss_scale(optimizer)) == 4.0


@ON_TENSORFLOW_ONLY
def test_a_finite_step_is_applied_and_moves_the_counter():
    precision, optimizer, update = mixed_update(initial_scale=8.0)
    skipped = precision.apply(optimizer, update, flag(True))
    assert float(numpy(skipped)) == 0.0
    assert update.runs == 1
    np.testing.assert_array_equal(numpy(update.variable), [0.5, 0.5])
    assert int(numpy(update.optimizer.iterations)) == 1
    assert float(numpy(optimizer.dynamic_scale)) == 8.0 and int(numpy(optimizer.step_counter)) == 1
