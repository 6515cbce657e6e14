"""History, what fit returns: one value per recorded epoch for every name, aligned with `history.epoch`, as plain
floats a user can plot or dump to JSON."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest

from ktrainer.loop.history import History

pytestmark = pytest.mark.both_backends


def test_a_new_history_is_empty():
    history = History()
    assert history.history == {} and history.epoch == []
    assert repr(history) == "History(epochs=[], names=[])"


def test_a_name_missing_from_an_epoch_gets_nan_there_so_every_series_stays_aligned():
    history = History()
    history.record(0, {"train/loss_epoch": 1.0, "val/loss": 2.0})
    history.record(1, {"train/loss_epoch": 0.5})  # no validation this epoch
    history.record(2, {"train/loss_epoch": 0.25, "val/loss": 1.5, "val/acc": 0.75})
    history.record(3, {})
    assert history.epoch == [0, 1, 2, 3]
    assert {name: len(series) for name, series in history.history.items()} == {
        "train/loss_epoch": 4, "val/loss": 4, "val/acc": 4}
    np.testing.assert_array_equal(history.history["train/loss_epoch"], [1.0, 0.5, 0.25, np.nan])
    np.testing.assert_array_equal(history.history["val/loss"], [2.0, np.nan, 1.5, np.nan])
    np.testing.assert_array_equal(history.history["val/acc"], [np.nan, np.nan, 0.75, np.nan])


def test_values_are_stored_as_python_floats_that_json_can_write():
    history = History()
    history.record(5, {"a": np.float32(0.5), "b": 3, "c": keras.ops.convert_to_numpy(keras.ops.ones(()))})
    assert history.history == {"a": [0.5], "b": [3.0], "c": [1.0]}
    assert all(type(series[0]) is float for series in history.history.values())
    assert json.loads(json.dumps(history.history)) == {"a": [0.5], "b": [3.0], "c": [1.0]}


def test_epochs_are_kept_as_given_and_a_diverged_epochs_nan_stays_visible():
    history = History()
    history.record(7, {"train/loss_epoch": 0.5})  # a resumed fit starts at its checkpoint's epoch
    history.record(8, {"train/loss_epoch": float("nan")})
    assert history.epoch == [7, 8]
    assert history.history["train/loss_epoch"][0] == 0.5 and math.isnan(history.history["train/loss_epoch"][1])
    assert repr(history) == "History(epochs=[7, 8], names=['train/loss_epoch'])"
