"""Checks that make a Module's silent mistakes loud before anything is built: Keras layers created outside build(),
validation data with no validation_step, and an epoch of 0 training batches; each error says how to fix it."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.trainer.module_checks import check_layers_created_in_build, warn_val_data_without_validation_step

pytestmark = pytest.mark.both_backends


class Holder(kt.Module):
    """A Module holding what the test gives it, as attributes set in __init__."""

    def __init__(self, **attributes):
        super().__init__()
        vars(self).update(attributes)


def test_a_module_without_layers_passes():
    check_layers_created_in_build(Holder(units=4, rate=0.1, names=["a"], table={"k": 1}))


def test_layers_created_in_init_are_named_with_how_to_move_them_into_build():
    module = Holder(encoder=keras.layers.Dense(4), heads=[keras.layers.Dense(1), "not a layer"],
                    blocks={"norm": keras.layers.LayerNormalization()})
    with pytest.raises(TypeError, match=r"Holder holds Keras layers created before the Trainer built it: self.encoder "
                                        r"\(Dense\), self.heads \(Dense\), self.blocks \(LayerNormalization\). Create "
                                        r"them in Holder.build\(\) instead"):
        check_layers_created_in_build(module)


def test_the_error_says_why_and_how_a_data_layer_may_stay():
    with pytest.raises(TypeError) as raised:
        check_layers_created_in_build(Holder(normalize=keras.layers.Normalization()))
    message = str(raised.value)
    assert "computes in float32 under '16-mixed' and cannot be placed on several devices" in message
    assert "give it a name that starts with '_', e.g. self._normalize" in message


def test_a_private_layer_and_a_model_made_in_init_are_told_apart():
    check_layers_created_in_build(Holder(_normalize=keras.layers.Normalization()))
    made_in_init = Holder(model=keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)]))
    with pytest.raises(TypeError, match=r"self.model \(Sequential\)"):
        check_layers_created_in_build(made_in_init)


class SubLayers(kt.Module):
    def build(self):
        self.head = keras.layers.Dense(1)  # a sub-layer assigned in build(), as the error allows
        return keras.Sequential([keras.layers.Input((2,)), self.head])

    def configure_optimizers(self):
        return keras.optimizers.SGD(0.1)

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))


def test_a_module_the_trainer_built_passes_with_the_sub_layers_it_assigned_in_build():
    module = SubLayers()
    data = np.ones((4, 2), np.float32), np.ones(4, np.float32)
    kt.Trainer(max_steps=1, batch_size=4, logger=False, enable_progress_bar=False,
               enable_checkpointing=False).fit(module, train_data=data)
    check_layers_created_in_build(module)  # a second fit/validate/test of the same module checks again


class Validating(kt.Module):
    def validation_step(self, batch):
        return None


def test_validation_data_without_a_validation_step_warns_that_validation_is_skipped():
    with pytest.warns(UserWarning, match=r"Validation data was given, but Holder defines no validation_step\(\), so "
                                         r"validation is skipped. Define validation_step\(self, batch\)"):
        assert warn_val_data_without_validation_step(Holder(), kt.Module) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_val_data_without_validation_step(Validating(), kt.Module) is True


def test_metrics_and_variables_created_in_init_are_refused_with_how_to_move_them_into_build():
    module = Holder(accuracy=keras.metrics.SparseCategoricalAccuracy(), trackers=[keras.metrics.Mean()],
                    temperature=keras.Variable(1.0))
    with pytest.raises(TypeError, match=r"Holder holds Keras metrics or variables created before the Trainer built "
                                        r"it: self.accuracy \(SparseCategoricalAccuracy\), self.trackers \(Mean\), "
                                        r"self.temperature \(.*Variable\). Create them in Holder.build\(\) instead"):
        check_layers_created_in_build(module)
    check_layers_created_in_build(Holder(_running=keras.metrics.Mean()))  # private: the user's own business


class MetricInInit(SubLayers):
    def __init__(self):
        super().__init__()
        self.mae = keras.metrics.MeanAbsoluteError()


def test_fit_refuses_a_metric_made_in_init_before_anything_is_written(tmp_path):
    data = np.ones((4, 2), np.float32), np.ones(4, np.float32)
    trainer = kt.Trainer(max_steps=1, batch_size=4, enable_progress_bar=False, default_root_dir=str(tmp_path / "run"))
    with pytest.raises(TypeError, match=r"self.mae \(MeanAbsoluteError\)"):
        trainer.fit(MetricInInit(), train_data=data)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*"))
