"""The keras.io VAE ported to a Module trains as Keras trains it: with its KL term as an add_loss (model.losses added
to the loss, as fit adds them), and as the example's own custom train_step."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import ktrainer as kt
from tests.parity.harness import assert_same_epoch_losses, assert_same_weights, fit_both

RNG = np.random.default_rng(3)
DATA = RNG.random((64, 8)).astype("float32")


class Sampling(keras.layers.Layer):
    """z = mean + exp(log_var / 2) * noise; with `kl=True` it also adds the KL term with add_loss."""

    def __init__(self, kl: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.kl = kl
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        if self.kl:
            self.add_loss(-0.5 * keras.ops.mean(keras.ops.sum(
                1 + z_log_var - keras.ops.square(z_mean) - keras.ops.exp(z_log_var), axis=1)))
        noise = keras.random.normal(keras.ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + keras.ops.exp(0.5 * z_log_var) * noise


def encoder(kl: bool) -> keras.Model:
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    z_mean, z_log_var = keras.layers.Dense(2)(hidden), keras.layers.Dense(2)(hidden)
    return keras.Model(inputs, [z_mean, z_log_var, Sampling(kl)([z_mean, z_log_var])], name="encoder")


def decoder() -> keras.Model:
    latent = keras.Input((2,))
    return keras.Model(latent, keras.layers.Dense(8, activation="sigmoid")(
        keras.layers.Dense(16, activation="relu")(latent)), name="decoder")


def vae_with_add_loss() -> keras.Model:
    inputs = keras.Input((8,))
    _, _, z = encoder(kl=True)(inputs)
    return keras.Model(inputs, decoder()(z))


class AddLossPort(kt.Module):
    """The reconstruction loss only: the KL term comes in through model.losses, as in fit."""

    def build(self):
        return vae_with_add_loss()

    def configure_optimizers(self):
        return self.make_optimizer()

    def training_step(self, batch):
        return keras.losses.BinaryCrossentropy()(batch, self.model(batch, training=True))


def test_a_vae_with_its_kl_term_as_add_loss_trains_as_fit():
    run = fit_both(vae_with_add_loss, AddLossPort, {"optimizer": lambda: keras.optimizers.Adam(0.01),
                                                    "loss": "binary_crossentropy"}, DATA, DATA, train_data=DATA)
    assert_same_weights(run)
    assert_same_epoch_losses(run)
    assert all(value > 0 for value in run.history["train/reg_loss_epoch"])


class KerasVAE(keras.Model):
    """The example's VAE: its own train_step computes reconstruction + KL."""

    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = encoder(kl=False), decoder()
        self.total_loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, data):
        return self.decoder(self.encoder(data)[2])

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = keras.ops.mean(keras.ops.sum(keras.ops.square(data - reconstruction), axis=1))
            kl_loss = -0.5 * (1 + z_log_var - keras.ops.square(z_mean) - keras.ops.exp(z_log_var))
            total_loss = reconstruction_loss + keras.ops.mean(keras.ops.sum(kl_loss, axis=1))
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
        self.total_loss_tracker.update_state(total_loss)
        return {"loss": self.total_loss_tracker.result()}


class TrainStepPort(kt.Module):
    """The example's train_step body as training_step: the Trainer differentiates and applies."""

    def build(self):
        model = KerasVAE()
        model(DATA[:1])
        return model

    def configure_optimizers(self):
        return self.make_optimizer()

    def training_step(self, data):
        z_mean, z_log_var, z = self.model.encoder(data, training=True)
        reconstruction = self.model.decoder(z, training=True)
        reconstruction_loss = keras.ops.mean(keras.ops.sum(keras.ops.square(data - reconstruction), axis=1))
        kl_loss = -0.5 * (1 + z_log_var - keras.ops.square(z_mean) - keras.ops.exp(z_log_var))
        return reconstruction_loss + keras.ops.mean(keras.ops.sum(kl_loss, axis=1))


def built_vae() -> keras.Model:
    model = KerasVAE()
    model(DATA[:1])
    return model


def test_the_vaes_own_train_step_as_training_step_trains_as_fit():
    run = fit_both(built_vae, TrainStepPort, {"optimizer": lambda: keras.optimizers.Adam(0.01)}, DATA,
                   train_data=DATA)
    assert_same_weights(run)
    # fit's "loss" is the example's running Mean of the batch losses (each batch counts once); ours weighs each
    # batch by its size: the same when every batch is full, as here.
    assert_same_epoch_losses(run)
