"""`validate`, `test` and `predict(ckpt_path=...)` use a checkpoint's weights: the same numbers as the model
that was saved, nothing else of the run touched, and a checkpoint that does not fit refused before anything changes."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import CheckpointError
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.both_backends


def trainer(root, **arguments) -> kt.Trainer:
    return kt.Trainer(batch_size=16, enable_progress_bar=False, logger=False, default_root_dir=str(root), **arguments)


@pytest.fixture
def trained(tmp_path):
    """A run of 2 epochs with its checkpoints; the module as it ended."""
    module = Regressor()
    trainer(tmp_path, max_epochs=2).fit(module, train_data=regression_data(64), val_data=regression_data(32, seed=1))
    return tmp_path, module


@pytest.mark.parametrize("call", ["validate", "test"])
def test_a_fresh_module_evaluated_on_the_last_checkpoint_gives_the_saved_models_numbers(trained, call):
    root, module = trained
    data = regression_data(32, seed=2)
    expected = getattr(trainer(root), call)(module, data)
    fresh = Regressor()
    evaluating = trainer(root)
    results = getattr(evaluating, call)(fresh, data, ckpt_path="last")
    assert results == pytest.approx(expected, rel=1e-6)
    for saved, loaded in zip(module.model.get_weights(), fresh.model.get_weights(), strict=True):
        np.testing.assert_array_equal(saved, loaded)
    assert evaluating.global_step == 0 and evaluating.optimizer is None  # the run itself is not resumed


def test_a_fresh_module_predicts_with_the_last_checkpoints_weights(trained):
    root, module = trained
    x, _ = regression_data(24, seed=3)
    expected = trainer(root).predict(module, x)
    fresh = Regressor()
    predicting = trainer(root)
    predictions = predicting.predict(fresh, x, ckpt_path="last")
    np.testing.assert_allclose(predictions, expected, rtol=1e-6)
    assert predicting.global_step == 0 and predicting.optimizer is None
    with pytest.raises(ValueError, match="ckpt_path"):
        trainer(root).predict(Regressor(), x, ckpt_path="lst")


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.dense(x)


class SubclassedRegressor(Regressor):
    def build(self):
        return Subclassed()  # no variables until its first call


@pytest.mark.parametrize("call", ["validate", "predict"])
def test_a_subclassed_model_built_only_by_its_first_call_takes_the_checkpoints_weights(tmp_path, call):
    module = SubclassedRegressor()
    trainer(tmp_path, max_epochs=1).fit(module, train_data=regression_data(32))
    x, y = regression_data(16, seed=4)
    data = x if call == "predict" else (x, y)
    expected = getattr(trainer(tmp_path), call)(module, data)
    fresh = SubclassedRegressor()
    got = getattr(trainer(tmp_path), call)(fresh, data, ckpt_path="last")
    if call == "predict":
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    else:
        assert got == pytest.approx(expected, rel=1e-6)
    for saved, loaded in zip(module.model.get_weights(), fresh.model.get_weights(), strict=True):
        np.testing.assert_array_equal(saved, loaded)


def test_a_checkpoint_by_its_path_is_evaluated_too(trained):
    root, module = trained
    first = sorted(path.name for path in (root / "checkpoints").iterdir() if path.name.startswith("step-"))[0]
    fresh = Regressor()
    trainer(root).validate(fresh, regression_data(32), ckpt_path=str(root / "checkpoints" / first))
    assert not np.array_equal(fresh.model.get_weights()[0], module.model.get_weights()[0])  # epoch 1's weights
    assert np.any(fresh.model.get_weights()[0] != 0)


def test_no_checkpoint_yet_is_an_error_that_says_where_it_looked(tmp_path, recwarn):
    with pytest.raises(ValueError, match=r"ckpt_path='last': there is no checkpoint under .*checkpoints yet"):
        trainer(tmp_path).validate(Regressor(), regression_data(32), ckpt_path="last")
    assert not [w for w in recwarn if "starting a new run" in str(w.message)]  # that is fit's reading, not ours


def test_a_checkpoint_of_another_model_is_refused_and_the_weights_are_kept(trained):
    root, _ = trained
    other = Regressor(features=3)
    trainer(root).test(other, regression_data(16, features=3))
    before = other.model.get_weights()
    with pytest.raises(ValueError, match="does not match this model; nothing was loaded"):
        trainer(root).test(other, regression_data(16, features=3), ckpt_path="last")
    for kept, now in zip(before, other.model.get_weights(), strict=True):
        np.testing.assert_array_equal(kept, now)


def test_best_without_a_monitored_metric_is_a_checkpoint_error(trained):
    root, _ = trained
    with pytest.raises(CheckpointError, match="records a monitored metric"):
        trainer(root).validate(Regressor(), regression_data(16), ckpt_path="best")


def test_a_damaged_newest_checkpoint_is_named_in_a_warning_and_the_one_before_evaluated(trained):
    root, _ = trained
    newest = sorted(path for path in (root / "checkpoints").iterdir() if path.name.startswith("step-"))[-1]
    for data_file in newest.glob("*.tensors"):
        data_file.write_bytes(b"damaged")
    with pytest.warns(UserWarning, match=rf"{newest.name} is not valid .*passing over it"):
        trainer(root).validate(Regressor(), regression_data(16), ckpt_path="last")
