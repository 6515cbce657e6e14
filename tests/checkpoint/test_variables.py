"""Variables <-> checkpoint arrays: zero-copy snapshots that later updates leave alone, assignment, mismatches."""

from __future__ import annotations

import keras
import ml_dtypes
import numpy as np
import tensorflow as tf

from ktrainer.checkpoint.variables import assign_all, keyed, mismatches, read_value


def test_a_snapshot_is_not_changed_by_later_updates_of_the_variable():
    variable = keras.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    snapshot = read_value(variable)
    assert not snapshot.flags.writeable
    variable.assign_add(np.ones((2, 3), np.float32))
    variable.assign(np.full((2, 3), 9, np.float32))
    np.testing.assert_array_equal(snapshot, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(read_value(variable), np.full((2, 3), 9, np.float32))


def test_a_snapshot_survives_an_optimizer_step():
    variable = keras.Variable(np.ones(4, np.float32))
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build([variable])
    before = read_value(variable)
    optimizer.apply([np.ones(4, np.float32)], [variable])
    np.testing.assert_array_equal(before, np.ones(4, np.float32))
    assert not np.array_equal(read_value(variable), before)


def test_bfloat16_and_plain_tensorflow_variables_and_numpy_arrays():
    bf16 = keras.Variable(np.array([1.5, -2.0], np.float32), dtype="bfloat16")
    value = read_value(bf16)
    assert value.dtype == np.dtype(ml_dtypes.bfloat16) and value.tolist() == [1.5, -2.0]
    plain = tf.Variable([1, 2, 3], dtype=tf.int64)
    np.testing.assert_array_equal(read_value(plain), [1, 2, 3])
    array = np.arange(3)
    copied = read_value(array)
    array[:] = 0
    assert copied.tolist() == [0, 1, 2]


def test_assign_all_puts_every_array_back_and_converts_a_dtype_that_differs():
    variables = [keras.Variable(np.zeros(3, np.float32)), keras.Variable(np.zeros(2, np.float32), dtype="float16")]
    assign_all({"a": np.arange(3, dtype=np.float32), "b": np.array([0.5, 1.5], np.float32)}, variables)
    np.testing.assert_array_equal(np.asarray(variables[0]), [0, 1, 2])
    assert np.asarray(variables[1]).dtype == np.float16 and np.asarray(variables[1]).tolist() == [0.5, 1.5]


def test_mismatches_name_count_paths_and_shapes_but_not_keras_numbering():
    model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2)])
    saved = {key.replace("dense", "dense_17"): np.zeros(v.shape) for key, v in keyed(model.variables).items()}
    assert mismatches("model", saved, model.variables) == []  # per-process numbering is not a difference
    wrong = dict(saved)
    first = next(iter(wrong))
    wrong[first] = np.zeros((4, 2))
    [problem] = mismatches("model", wrong, model.variables)
    assert "(4, 2) vs" in problem and "(3, 2)" in problem
    assert "the checkpoint has 1 variables, this model has 2" in mismatches("model", {first: saved[first]},
                                                                             model.variables)[0]
