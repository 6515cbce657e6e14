"""`float32_layers`: inside `float32_at_construction` a layer matching a selector (its class, a subclass of it, or
the `name=` it was created with) is created float32 under a mixed policy while the others stay mixed, the matched
selectors are recorded and the constructor is restored after the block, even after an error; `keep_float32` makes
the matching layers of a built model compute in float32, returns their names, and names the model's layers when a
selector matches none; a model with a float32 layer between mixed ones still computes."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from ktrainer.precision import float32_layers
from ktrainer.precision.float32_layers import float32_at_construction, keep_float32

pytestmark = pytest.mark.both_backends


@pytest.fixture
def mixed():
    """The global dtype policy "mixed_float16" for the test, the previous one restored after it."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def policy(layer: keras.layers.Layer) -> str:
    return layer.dtype_policy.name


class WideDense(keras.layers.Dense):
    """A user's subclass of Dense."""


# ----- float32_at_construction -------------------------------------------------------------------------------------


def test_a_layer_of_a_selected_class_is_created_float32_and_others_stay_mixed(mixed):
    with float32_at_construction([keras.layers.Dense]):
        dense = keras.layers.Dense(4)
        norm = keras.layers.LayerNormalization()
    assert policy(dense) == "float32" and dense.compute_dtype == "float32"
    assert policy(norm) == "mixed_float16" and norm.compute_dtype == "float16"


def test_a_name_selector_matches_only_the_layer_created_with_that_name(mixed):
    with float32_at_construction(["head"]):
        head = keras.layers.Dense(1, name="head")
        other = keras.layers.Dense(1, name="header")
        unnamed = keras.layers.Dense(1)
    assert policy(head) == "float32"
    assert policy(other) == "mixed_float16" and policy(unnamed) == "mixed_float16"


def test_a_subclass_of_a_selected_class_matches(mixed):
    with float32_at_construction([keras.layers.Dense]) as matched:
        wide = WideDense(2)
    assert policy(wide) == "float32"
    assert matched == {keras.layers.Dense}


def test_a_requested_dtype_is_overridden_for_a_selected_layer(mixed):
    with float32_at_construction(["head"]):
        head = keras.layers.Dense(1, dtype="mixed_float16", name="head")
    assert policy(head) == "float32"


def test_the_yielded_set_records_the_selectors_that_matched(mixed):
    selectors = [keras.layers.Dense, "head", keras.layers.LayerNormalization, "absent"]
    with float32_at_construction(selectors) as matched:
        assert matched == set()
        keras.layers.Dense(3)
        assert matched == {keras.layers.Dense}  # filled as layers are made
        keras.layers.Dropout(0.1, name="head")
    assert matched == {keras.layers.Dense, "head"}


def test_the_constructor_is_restored_after_the_block(mixed):
    original = keras.layers.Layer.__init__
    with float32_at_construction([keras.layers.Dense]):
        assert keras.layers.Layer.__init__ is not original
    assert keras.layers.Layer.__init__ is original
    assert policy(keras.layers.Dense(1)) == "mixed_float16"


def test_the_constructor_is_restored_after_an_error_in_the_block(mixed):
    original = keras.layers.Layer.__init__
    with pytest.raises(RuntimeError, match="build failed"), float32_at_construction([keras.layers.Dense]):
        keras.layers.Dense(1)
        raise RuntimeError("build failed")
    assert keras.layers.Layer.__init__ is original
    assert policy(keras.layers.Dense(1)) == "mixed_float16"
    with float32_at_construction([keras.layers.Dense]):  # and the block can be entered again
        assert policy(keras.layers.Dense(1)) == "float32"


def test_a_block_inside_a_block_nests_and_each_restores_what_it_found(mixed):
    # Re-entrancy first, without blocking: a lock that did not nest would make the nested block wait forever.
    assert float32_layers._lock.acquire(blocking=False)
    try:
        assert float32_layers._lock.acquire(blocking=False), "a nested block would wait on the outer one"
        float32_layers._lock.release()
    finally:
        float32_layers._lock.release()
    original = keras.layers.Layer.__init__
    with float32_at_construction(["outer"]):
        with float32_at_construction(["inner"]):
            both = keras.layers.Dense(1, name="outer").dtype_policy.name
            inner = keras.layers.Dense(1, name="inner").dtype_policy.name
        after = keras.layers.Dense(1, name="outer").dtype_policy.name
    assert (both, inner, after) == ("float32", "float32", "float32")
    assert keras.layers.Layer.__init__ is original


def test_no_selectors_change_nothing(mixed):
    original = keras.layers.Layer.__init__
    with float32_at_construction([]) as matched:
        assert keras.layers.Layer.__init__ is original
        dense = keras.layers.Dense(1)
    assert matched == set()
    assert policy(dense) == "mixed_float16"


def test_a_model_built_in_the_block_computes_with_its_float32_layer(mixed):
    with float32_at_construction(["norm"]):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.LayerNormalization(name="norm"), keras.layers.Dense(2)])
    assert [policy(layer) for layer in model.layers] == ["mixed_float16", "float32", "mixed_float16"]
    assert model.get_layer("norm").weights[0].dtype == "float32"
    outputs = keras.ops.convert_to_numpy(model(np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)))
    assert outputs.shape == (3, 2) and np.isfinite(outputs).all()


# ----- keep_float32 ------------------------------------------------------------------------------------------------


def functional() -> keras.Model:
    """Dense "hidden" -> LayerNormalization "norm" -> Dense "mid" -> Dense "out", built."""
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    x = keras.layers.LayerNormalization(name="norm")(x)
    x = keras.layers.Dense(8, activation="tanh", name="mid")(x)
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(x))


def sequential() -> keras.Model:
    """The same layers as `functional`, in a Sequential model."""
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh", name="hidden"),
                             keras.layers.LayerNormalization(name="norm"),
                             keras.layers.Dense(8, activation="tanh", name="mid"), keras.layers.Dense(1, name="out")])


@pytest.mark.parametrize("make", [functional, sequential])
def test_keep_float32_changes_the_matching_layers_and_returns_their_names(mixed, make):
    model = make()
    assert keep_float32(model, [keras.layers.LayerNormalization, "out"]) == ["norm", "out"]
    computes = {layer.name: layer.compute_dtype for layer in model.layers
                if not isinstance(layer, keras.layers.InputLayer)}  # a functional model lists its input
    assert computes == {"hidden": "float16", "norm": "float32", "mid": "float16", "out": "float32"}
    assert all(w.dtype == "float32" for w in model.weights)  # variables were float32 already


@pytest.mark.parametrize("make", [functional, sequential])
def test_a_class_selector_changes_every_instance(mixed, make):
    model = make()
    assert keep_float32(model, [keras.layers.Dense]) == ["hidden", "mid", "out"]
    assert model.get_layer("norm").compute_dtype == "float16"


@pytest.mark.parametrize("selector", ["dense_99", keras.layers.Conv1D])
def test_a_selector_matching_no_layer_lists_the_layers_names_and_classes(mixed, selector):
    model = functional()
    with pytest.raises(ValueError, match="matches no layer of the model") as caught:
        keep_float32(model, [selector])
    message = str(caught.value)
    assert repr(selector) in message
    for described in ("hidden (Dense)", "norm (LayerNormalization)", "mid (Dense)", "out (Dense)"):
        assert described in message
    assert "InputLayer" not in message


def test_a_float32_layer_between_mixed_ones_computes_in_float32_and_the_model_still_runs(mixed):
    model = functional()
    keep_float32(model, ["norm"])
    norm = model.get_layer("norm")
    assert keras.backend.standardize_dtype(norm(np.ones((2, 8), "float16")).dtype) == "float32"
    outputs = keras.ops.convert_to_numpy(model(np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)))
    assert outputs.shape == (3, 1) and np.isfinite(outputs).all()
    assert keras.backend.standardize_dtype(outputs.dtype) == "float16"  # "out" is still mixed
