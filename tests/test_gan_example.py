"""examples/gan.py trains exactly as the keras.io example's own train_step under model.fit, and under '16-mixed'
without a skipped step after warm-up (manual optimization on both engines: tests/test_manual_optimization.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import ktrainer as kt

GAN_EXAMPLE = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "gan.py"))
LATENT = 16  # small, for speed; the example's architecture otherwise


class KerasGAN(keras.Model):
    """The keras.io example, as written for model.fit (its train_step, its compile)."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def call(self, latent_vectors):
        return self.generator(latent_vectors)

    def train_step(self, real_images):
        if isinstance(real_images, tuple):
            real_images = real_images[0]
        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(random_latent_vectors)
        combined_images = tf.concat([generated_images, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = tf.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply(grads, self.generator.trainable_weights)
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


class Losses(kt.callbacks.Callback):
    def __init__(self):
        self.d, self.g, self.skipped = [], [], []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.d.append(metrics["train/d_loss"])
        self.g.append(metrics["train/g_loss"])
        self.skipped.append(trainer.skipped_steps)


def test_the_ported_gan_trains_exactly_as_the_examples_train_step_under_fit(tmp_path):
    images = GAN_EXAMPLE["make_images"](count=96)
    keras.utils.set_random_seed(0)
    reference = KerasGAN(GAN_EXAMPLE["make_discriminator"](), GAN_EXAMPLE["make_generator"](LATENT), LATENT)
    reference.compile(keras.optimizers.Adam(0.0003), keras.optimizers.Adam(0.0003),
                      keras.losses.BinaryCrossentropy(from_logits=True))
    initial = [np.array(w) for w in reference.get_weights()]

    class Ported(GAN_EXAMPLE["GAN"]):
        def build(self):
            pair = super().build()
            pair.set_weights(initial)  # the same start: networks and the seed generator's state
            return pair

    d_per_batch = []
    recorder = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: d_per_batch.append(float(logs["d_loss"])))
    reference.fit(images, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[recorder])

    losses = Losses()
    module = Ported(latent_dim=LATENT)
    trainer = kt.Trainer(max_epochs=2, batch_size=32, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, callbacks=[losses])
    trainer.fit(module, train_data=images, shuffle=False)

    assert trainer.global_step == 6  # a step per batch: 3 batches x 2 epochs, two updates each
    for ours, theirs in zip(module.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    # fit reports the running mean over the epoch; the per-step loss of the first step is the same number.
    assert losses.d[0] == pytest.approx(d_per_batch[0], abs=1e-5)


def test_the_gan_trains_under_16_mixed_without_a_skipped_step_after_warm_up():
    losses = Losses()
    trainer = kt.Trainer(max_steps=12, batch_size=16, precision="16-mixed", logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, callbacks=[losses], seed=0)
    trainer.fit(GAN_EXAMPLE["GAN"](latent_dim=LATENT), train_data=GAN_EXAMPLE["make_images"](count=64))
    assert trainer.global_step == 12
    warm_up = len(losses.skipped) // 3
    assert losses.skipped[-1] == losses.skipped[warm_up]  # no step skipped after warm-up
    assert all(np.isfinite(losses.d)) and all(np.isfinite(losses.g))
    scales = {int(np.log2(trainer.optimizers[i].dynamic_scale.numpy())) for i in (0, 1)}
    assert len(trainer.optimizers) == 2 and all(s > 0 for s in scales)  # each optimizer has its own loss scale
