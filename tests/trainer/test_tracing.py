"""The first trace shows what the model really does: its output dtype, and whether it trains in training mode."""

from __future__ import annotations

import os
import warnings

import keras
import pytest

import ktrainer as kt
from tests.helpers import Classifier


class Subclassed(keras.Model):
    """The output layer is created first and the hidden one second: creation order says nothing of the output."""

    def __init__(self, output_dtype):
        super().__init__()
        self.head = keras.layers.Dense(3, dtype=output_dtype)
        self.hidden = keras.layers.Dense(16, activation="relu")

    def call(self, x, training=False):
        return self.head(self.hidden(x))


class SubclassedModule(Classifier):
    def __init__(self, output_dtype):
        super().__init__()
        self.output_dtype = output_dtype

    def build(self):
        return Subclassed(self.output_dtype)


def fit(module, **kwargs):
    kt.Trainer(max_steps=1, batch_size=64, enable_progress_bar=False, logger=False, enable_checkpointing=False,
               **kwargs).fit(module)


def test_a_subclassed_model_whose_output_is_float32_is_not_warned_about():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(SubclassedModule("float32"), precision="16-mixed")


def test_a_subclassed_model_whose_output_is_float16_is_warned_about_at_the_users_line():
    with pytest.warns(UserWarning, match="the model's output is float16, not float32") as caught:
        fit(SubclassedModule(None), precision="16-mixed")
    [warned] = [w for w in caught if "not float32" in str(w.message)]
    package = os.path.dirname(kt.__file__) + os.sep
    assert not warned.filename.startswith(package), warned.filename  # the user's call, not ktrainer's inside


class WithDropout(Classifier):
    def __init__(self, training):
        super().__init__()
        self.training = training

    def build(self):
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dropout(0.5, name="drop"), keras.layers.Dense(3)])

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True) if self.training else self.model(x)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def test_a_model_called_without_training_true_in_training_step_is_warned_about_once():
    with pytest.warns(UserWarning, match=r"without training=True, so drop \(Dropout\) ran as in inference.*"
                                         r"self.model\(x, training=True\)") as caught:
        fit(WithDropout(training=False), max_epochs=1)
    assert len([w for w in caught if "training=True" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(WithDropout(training=True))


class VAE(keras.Model):
    """keras.io's VAE shape: the step calls the encoder and the decoder itself, never the VAE's own call."""

    def __init__(self, decoder_dtype):
        super().__init__()
        inputs = keras.Input((20,))
        self.encoder = keras.Model(inputs, keras.layers.Dense(4, name="z", dtype="float32")(
            keras.layers.Dense(8, activation="relu")(inputs)), name="encoder")
        latent = keras.Input((4,))
        self.decoder = keras.Model(latent, keras.layers.Dense(20, name="reconstruction", dtype=decoder_dtype)(
            keras.layers.Dense(8, activation="relu")(latent)), name="decoder")

    def call(self, x):
        return self.decoder(self.encoder(x))


class VAEModule(Classifier):
    def __init__(self, decoder_dtype):
        super().__init__()
        self.decoder_dtype = decoder_dtype

    def build(self):
        return VAE(self.decoder_dtype)

    def training_step(self, batch):
        x, _ = batch
        z = self.model.encoder(x, training=True)
        reconstruction = self.model.decoder(z, training=True)
        return keras.ops.mean(keras.ops.square(keras.ops.cast(reconstruction, "float32") - x))


def test_a_sub_model_the_step_calls_itself_is_checked_for_its_output_dtype():
    with pytest.warns(UserWarning, match=r"the output of 'decoder' is float16, not float32.*'reconstruction'"):
        fit(VAEModule(None), precision="16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(VAEModule("float32"), precision="16-mixed")
