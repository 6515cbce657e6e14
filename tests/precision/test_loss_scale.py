"""Loss scaling as objects: `scale_gradient` keeps None as None, keeps a sparse gradient sparse and keeps the
gradient's dtype; `all_finite` finds an inf or a NaN in any gradient; `NoLossScale` is the identity;
`DynamicLossScale` reads and moves the `LossScaleOptimizer`'s own variables: the initial scale before it is built,
the loss multiplied and the gradients divided once, the scale doubled after `growth_interval` finite steps and
halved on a non-finite one."""

from __future__ import annotations

from collections import namedtuple

import keras
import numpy as np
import pytest

from ktrainer.precision.loss_scale import DynamicLossScale, NoLossScale, all_finite, scale_gradient

pytestmark = pytest.mark.both_backends

# What a sparse gradient (tf.IndexedSlices) offers, on every backend.
Slices = namedtuple("Slices", ["values", "indices", "dense_shape"])


def numpy(x) -> np.ndarray:
    """A tensor or variable as a numpy array."""
    return keras.ops.convert_to_numpy(x)


def dtype(x) -> str:
    """A tensor's dtype as Keras names it ("float16", "float32", ...)."""
    return keras.backend.standardize_dtype(x.dtype)


def tensor(values, dtype: str = "float32"):
    return keras.ops.convert_to_tensor(np.asarray(values, dtype))


def sparse(values, dtype: str = "float32") -> Slices:
    """Rows 0 and 3 of a 5 x 2 table."""
    return Slices(tensor(values, dtype), tensor([0, 3], "int32"), tensor([5, 2], "int32"))


def loss_scale_optimizer(initial_scale: float = 8.0) -> keras.mixed_precision.LossScaleOptimizer:
    return keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=initial_scale,
                                                    dynamic_growth_steps=3)


def built(initial_scale: float = 8.0) -> keras.mixed_precision.LossScaleOptimizer:
    """A LossScaleOptimizer built on one variable: its `dynamic_scale` and `step_counter` exist."""
    optimizer = loss_scale_optimizer(initial_scale)
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    return optimizer


# ----- scale_gradient ----------------------------------------------------------------------------------------------


def test_scale_gradient_keeps_none_as_none():
    assert scale_gradient(None, 2.0) is None


def test_scale_gradient_multiplies_a_dense_gradient():
    scaled = scale_gradient(tensor([1.0, -2.0, 0.5]), tensor(4.0))
    np.testing.assert_array_equal(numpy(scaled), [4.0, -8.0, 2.0])


def test_scale_gradient_keeps_a_sparse_gradient_sparse():
    gradient = sparse([[1.0, 2.0], [3.0, 4.0]])
    scaled = scale_gradient(gradient, 0.5)
    assert type(scaled) is Slices  # not densified into the whole 5 x 2 table
    np.testing.assert_array_equal(numpy(scaled.values), [[0.5, 1.0], [1.5, 2.0]])
    assert scaled.indices is gradient.indices and scaled.dense_shape is gradient.dense_shape


def test_scale_gradient_casts_the_factor_to_the_gradients_dtype():
    factor = tensor(0.25)  # float32
    dense = scale_gradient(tensor([4.0, 8.0], "float16"), factor)
    assert dtype(dense) == "float16"
    np.testing.assert_array_equal(numpy(dense), np.asarray([1.0, 2.0], "float16"))
    values = scale_gradient(sparse([[4.0, 8.0], [12.0, 16.0]], "float16"), factor).values
    assert dtype(values) == "float16"
    np.testing.assert_array_equal(numpy(values), np.asarray([[1.0, 2.0], [3.0, 4.0]], "float16"))


# ----- all_finite --------------------------------------------------------------------------------------------------


def test_all_finite_is_true_for_finite_gradients():
    assert bool(numpy(all_finite([tensor([1.0, -2.0]), tensor([[3.0]]), sparse([[1.0, 2.0], [3.0, 4.0]])])))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", ["first", "last dense", "sparse"])
def test_all_finite_is_false_with_an_inf_or_a_nan_in_any_gradient(bad, where):
    gradients = {"first": tensor([1.0, 2.0]), "last dense": tensor([[3.0, 4.0]]),
                 "sparse": sparse([[1.0, 2.0], [3.0, 4.0]])}
    gradients[where] = {"first": tensor([1.0, bad]), "last dense": tensor([[bad, 4.0]]),
                        "sparse": sparse([[1.0, 2.0], [3.0, bad]])}[where]
    assert not bool(numpy(all_finite(list(gradients.values()))))


def test_all_finite_ignores_none():
    assert bool(numpy(all_finite([None, tensor([1.0]), None])))
    assert not bool(numpy(all_finite([None, tensor([np.nan])])))


@pytest.mark.parametrize("gradients", [[], [None, None]])
def test_all_finite_is_true_without_gradients(gradients):
    assert bool(numpy(all_finite(gradients)))


# ----- NoLossScale -------------------------------------------------------------------------------------------------


def test_no_loss_scale_is_the_identity():
    loss_scale = NoLossScale()
    loss = tensor(3.0)
    gradients = [tensor([1.0]), None, sparse([[1.0, 2.0], [3.0, 4.0]])]
    assert loss_scale.scale(loss) is loss and loss_scale.scale(loss, scale=tensor(8.0)) is loss
    assert loss_scale.unscale(gradients) is gradients and loss_scale.unscale(gradients, scale=tensor(8.0)) is gradients
    assert loss_scale.value() is None
    assert loss_scale.scaling is False


# ----- DynamicLossScale --------------------------------------------------------------------------------------------


def test_the_value_is_the_initial_scale_before_the_optimizer_is_built_then_its_variable():
    optimizer = loss_scale_optimizer(initial_scale=8.0)
    loss_scale = DynamicLossScale(optimizer)
    assert loss_scale.scaling is True and loss_scale.growth_interval == 3
    assert float(loss_scale.value()) == 8.0
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    assert loss_scale.value() is optimizer.dynamic_scale
    optimizer.dynamic_scale.assign(32.0)
    assert float(numpy(loss_scale.value())) == 32.0


def test_the_variables_are_the_optimizers_scale_and_step_counter():
    optimizer = built()
    variables = DynamicLossScale(optimizer).variables
    assert len(variables) == 2
    assert variables[0] is optimizer.dynamic_scale and variables[1] is optimizer.step_counter


def test_scale_multiplies_the_loss_by_the_current_or_the_given_scale():
    loss_scale = DynamicLossScale(built(initial_scale=8.0))
    assert float(numpy(loss_scale.scale(tensor(1.5)))) == 12.0
    assert float(numpy(loss_scale.scale(tensor(1.5), scale=tensor(2.0)))) == 3.0
    half = loss_scale.scale(tensor(1.5, "float16"))
    assert dtype(half) == "float16" and float(numpy(half)) == 12.0


def test_unscale_divides_every_gradient_once_and_keeps_sparse_ones_sparse():
    loss_scale = DynamicLossScale(built(initial_scale=8.0))
    dense, none, rows = loss_scale.unscale([tensor([8.0, -16.0]), None, sparse([[8.0, 24.0], [4.0, 2.0]])])
    np.testing.assert_array_equal(numpy(dense), [1.0, -2.0])
    assert none is None
    assert type(rows) is Slices
    np.testing.assert_array_equal(numpy(rows.values), [[1.0, 3.0], [0.5, 0.25]])
    given = loss_scale.unscale([tensor([8.0])], scale=tensor(4.0))
    np.testing.assert_array_equal(numpy(given[0]), [2.0])


@pytest.mark.parametrize(("finite", "counter", "expected"), [
    (True, 0, (8.0, 1)),  # a finite step counts
    (True, 1, (8.0, 2)),
    (True, 2, (16.0, 0)),  # the growth_interval-th (3rd) finite step doubles and restarts the count
    (False, 0, (4.0, 0)),  # a non-finite step halves and restarts the count
    (False, 2, (4.0, 0)),  # even one short of growing
])
def test_next_state_counts_doubles_and_halves(finite, counter, expected):
    loss_scale = DynamicLossScale(loss_scale_optimizer())
    scale, new_counter = loss_scale.next_state(keras.ops.convert_to_tensor(finite), tensor(8.0),
                                               keras.ops.convert_to_tensor(counter, "int32"))
    assert (float(numpy(scale)), int(numpy(new_counter))) == expected
    assert dtype(scale) == "float32"


def test_update_assigns_the_optimizers_scale_and_counter():
    optimizer = built(initial_scale=8.0)
    loss_scale = DynamicLossScale(optimizer)
    seen = []
    for finite in (True, True, True, True, False, True):
        loss_scale.update(keras.ops.convert_to_tensor(finite))
        seen.append((float(numpy(optimizer.dynamic_scale)), int(numpy(optimizer.step_counter))))
    assert seen == [(8.0, 1), (8.0, 2), (16.0, 0), (16.0, 1), (8.0, 0), (8.0, 1)]
