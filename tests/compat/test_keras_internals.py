"""The Keras internals ktrainer relies on are checked at import, and the loss-scaling switch is on only while a step
is traced, never while the Trainer merely runs."""

from __future__ import annotations

import types

import keras
import numpy as np
import pytest
from keras.src.losses import loss as keras_loss

import ktrainer as kt
from ktrainer.compat import keras_internals

ORIGINAL = keras_loss.scale_loss_for_distribution


def test_a_keras_without_the_internal_fails_loudly(monkeypatch):
    monkeypatch.delattr(keras_loss, "scale_loss_for_distribution")
    with pytest.raises(ImportError, match="scale_loss_for_distribution.*install a Keras release ktrainer supports"):
        keras_internals._check()


def test_a_keras_without_flatten_layers_fails_loudly(monkeypatch):
    monkeypatch.delattr(keras.layers.Layer, "_flatten_layers")
    with pytest.raises(ImportError, match="_flatten_layers.*install a Keras release ktrainer supports"):
        keras_internals._check()


def test_flat_layers_finds_nested_models_and_layers_held_as_attributes_without_the_model():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="inner_dense")], name="inner")
    outer = keras.Sequential([keras.Input((3,)), inner, keras.layers.Dense(1, name="head")], name="outer")
    names = [layer.name for layer in keras_internals.flat_layers(outer)
             if not isinstance(layer, keras.layers.InputLayer)]
    assert names == ["inner", "inner_dense", "head"]
    assert "outer" not in names and [layer.name for layer in outer.layers] == ["inner", "head"]


class SeesKeras(kt.callbacks.Callback):
    def __init__(self):
        self.during_the_run = []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.during_the_run.append(keras_loss.scale_loss_for_distribution is ORIGINAL)


class Traced(kt.Module):
    def __init__(self):
        super().__init__()
        self.while_traced = []

    def build(self):
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def configure_optimizers(self):
        return keras.optimizers.SGD(0.1)

    def training_step(self, batch):
        self.while_traced.append(keras_loss.scale_loss_for_distribution is ORIGINAL)
        x, y = batch
        return keras.losses.MeanSquaredError()(y, self.model(x)[:, 0])


def test_keras_is_patched_only_while_a_step_is_traced():
    seen, module = SeesKeras(), Traced()
    x = np.ones((16, 3), "float32")
    kt.Trainer(max_steps=2, batch_size=8, logger=False, enable_progress_bar=False, enable_checkpointing=False,
               callbacks=[seen]).fit(module, train_data=(x, x.sum(axis=1)))
    assert module.while_traced and not any(module.while_traced)  # traced: Keras's scaling off
    assert seen.during_the_run == [True, True]  # between steps: Keras as it ships
    assert keras_loss.scale_loss_for_distribution is ORIGINAL



@pytest.mark.jax_only
def test_on_jax_keras_takes_an_unimported_tensorflow_for_absent_only_inside_the_block(monkeypatch):
    lazy = keras_internals._module_utils.tensorflow  # Keras's lazy handle (TensorFlow is refused in this session)
    with keras_internals.tensorflow_left_alone():
        with keras_internals.tensorflow_left_alone():
            assert lazy.available is False
        assert lazy.available is False  # still inside the outer block
    assert lazy._available is None  # Keras asks afresh
    with pytest.raises(KeyError), keras_internals.tensorflow_left_alone():
        raise KeyError("a failure inside")
    assert lazy._available is None
    with keras_internals.tensorflow_left_alone():
        monkeypatch.setattr(lazy, "module", types.ModuleType("tensorflow"))  # code inside loaded it after all
    assert lazy._available is None  # not left at False while TensorFlow is there
