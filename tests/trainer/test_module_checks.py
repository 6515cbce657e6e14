"""Checks that make a Module's silent mistakes loud before anything is built: Keras layers created outside build(),
validation data with no validation_step, and an epoch of 0 training batches; each error says how to fix it."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.trainer.module_checks import (
    check_layers_created_in_build,
    check_training_steps,
    warn_val_data_without_validation_step,
)

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


@pytest.mark.parametrize("batches", [1, 7, None])
def test_an_epoch_with_batches_or_of_unknown_length_passes(batches):
    check_training_steps(batches, None, batch_size=8, replicas=4)


def test_zero_batches_of_known_data_name_the_examples_the_batch_and_the_replicas():
    with pytest.raises(ValueError, match=r"train_data gives 0 training batches per epoch: 20 examples, global batch 32 "
                                         r"\(batch_size=8 per device x 4 replicas\). With several replicas the last "
                                         r"incomplete batch is dropped"):
        check_training_steps(0, 20, batch_size=8, replicas=4)


def test_zero_batches_from_a_dataset_say_it_was_empty_or_too_small_and_what_to_change():
    with pytest.raises(ValueError, match=r"val_data yielded no batch in an epoch: it is empty \(check filters and "
                                         r"takes; a generator is read as one stream across epochs and had ended: "
                                         r"give it batches for every epoch, or pass an object whose __iter__ starts "
                                         r"a new pass\), or holds fewer examples than one global batch 16 "
                                         r"\(batch_size=16 per device x 1 replica\)"):
        check_training_steps(0, None, batch_size=16, replicas=1, what="val_data")
