"""Which data a call runs on: given before the module's hook, a clear error for none, the validation split's
refusals, and the shuffle setting a resume keeps. (Endless tf.data training data: tests/data/test_sources.py.)"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from ktrainer.data.stage_data import choose_source, shuffle_setting, split_training_data
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.both_backends


def test_given_data_comes_before_the_hook_and_the_hook_is_asked_otherwise():
    given, hooked = regression_data(n=32), regression_data(n=48)
    source = choose_source(given, lambda: hooked, "train_data", global_batch_size=16, training=True, required=True)
    assert source.num_examples == 32
    source = choose_source(None, lambda: hooked, "train_data", global_batch_size=16, training=True, required=True)
    assert source.num_examples == 48


def test_no_data_is_an_error_only_where_data_is_required():
    with pytest.raises(ValueError, match=r"No train_data: pass it .* or return it from the module's train_data\(\)"):
        choose_source(None, lambda: None, "train_data", global_batch_size=16, training=True, required=True)
    assert choose_source(None, lambda: None, "val_data", global_batch_size=16, training=False, required=False) is None


@pytest.mark.parametrize(("what", "call"), [("train_data", "trainer.fit(module, train_data=...)"),
                                            ("val_data", "trainer.validate(module, data)"),
                                            ("test_data", "trainer.test(module, data)"),
                                            ("predict_data", "trainer.predict(module, data)")])
def test_missing_data_names_the_call_and_the_hook_that_give_it(what, call):
    with pytest.raises(ValueError) as raised:
        choose_source(None, lambda: None, what, global_batch_size=16, training=False, required=True)
    assert f"({call}) or return it from the module's {what}() hook" in str(raised.value)


def test_only_training_data_is_shuffled_and_drops_a_ragged_remainder():
    data = regression_data(n=40)
    train = choose_source(data, lambda: None, "train_data", global_batch_size=16, training=True, required=True,
                          shuffle=True, drop_remainder=True)
    val = choose_source(data, lambda: None, "val_data", global_batch_size=16, training=False, required=True,
                        shuffle=True, drop_remainder=True)
    assert (train.shuffle, train.drop_remainder) == (True, True)
    assert (val.shuffle, val.drop_remainder) == (False, False)


def test_split_takes_the_tail_of_the_given_or_the_modules_data():
    x, y = regression_data(n=40)
    (train_x, _), (val_x, _) = split_training_data(Regressor(), (x, y), 0.25)
    np.testing.assert_array_equal(val_x, x[30:])
    np.testing.assert_array_equal(train_x, x[:30])

    class WithData(Regressor):
        def train_data(self):
            return x, y

    (train_x, _), _ = split_training_data(WithData(), None, 0.5)
    np.testing.assert_array_equal(train_x, x[:20])


def test_split_refuses_two_sources_of_validation_data_and_no_training_data():
    class WithValidation(Regressor):
        def val_data(self):
            return regression_data(n=8)

    with pytest.raises(ValueError, match=r"both give validation data"):
        split_training_data(WithValidation(), regression_data(n=40), 0.25)
    with pytest.raises(ValueError, match="has no training data to split"):
        split_training_data(Regressor(), None, 0.25)


@pytest.mark.parametrize(("given", "saved", "expected"),
                         [(None, None, True), (None, False, False), (False, None, False), (True, True, True)])
def test_shuffle_is_as_given_else_as_saved_else_on(given, saved, expected):
    assert shuffle_setting(given, saved) is expected


def test_a_shuffle_setting_that_differs_from_the_checkpoints_is_kept_and_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="ktrainer"):
        assert shuffle_setting(True, False) is True
    assert "trained with shuffle=False under shuffle=True" in caplog.text
