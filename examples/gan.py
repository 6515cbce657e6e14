"""The keras.io GAN ("Customizing what happens in fit()": a GAN overriding train_step), ported to a Module.

The example's own `train_step` updates the discriminator, then the generator, each with its own
optimizer. Here the same code is `training_step` with manual optimization: `self.manual_step`
makes each update, and the Trainer adds what `fit` did not: mixed precision with loss scaling per
optimizer, the same skip decision on every replica, checkpoints of both optimizers, TensorBoard.

    python examples/gan.py [--precision 16-mixed] [--max-steps 40]

It trains on generated 28x28 "digits" (blurred random strokes), so it needs no download.
tests/test_gan_example.py checks that it trains exactly as the example's train_step under
`model.fit` does (within 1e-5), and under "16-mixed" without a skipped step after warm-up.
"""

from __future__ import annotations

import argparse

import keras
import numpy as np

import ktrainer as kt

LATENT_DIM = 128


def make_discriminator() -> keras.Model:
    """The example's discriminator."""
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        keras.layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2D(128, (3, 3), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(1, dtype="float32"),  # float32 logits: the loss needs them under a 16-bit policy
    ], name="discriminator")


def make_generator(latent_dim: int = LATENT_DIM) -> keras.Model:
    """The example's generator."""
    return keras.Sequential([
        keras.Input(shape=(latent_dim,)),
        keras.layers.Dense(7 * 7 * 128),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Reshape((7, 7, 128)),
        keras.layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2D(1, (7, 7), padding="same", activation="sigmoid", dtype="float32"),
    ], name="generator")


class Pair(keras.Model):
    """The discriminator, the generator and the seed generator of their noise, in one model (so the Trainer
    places, saves and restores all of them)."""

    def __init__(self, discriminator: keras.Model, generator: keras.Model, latent_dim: int = LATENT_DIM) -> None:
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, latent_vectors):
        """Generate images from latent vectors."""
        return self.generator(latent_vectors)


class GAN(kt.Module):
    """The GAN as a Module: two optimizers, two updates per batch.

    Args:
        latent_dim: Size of the generator's input.
        lr: Adam learning rate of both optimizers.
    """

    automatic_optimization = False

    def __init__(self, latent_dim: int = LATENT_DIM, lr: float = 0.0003) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.latent_dim, self.lr = latent_dim, lr
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def build(self) -> keras.Model:
        """The pair of networks."""
        return Pair(make_discriminator(), make_generator(self.latent_dim), self.latent_dim)

    def configure_optimizers(self) -> dict:
        """One optimizer per network."""
        return {"d": keras.optimizers.Adam(learning_rate=self.lr), "g": keras.optimizers.Adam(learning_rate=self.lr)}

    def training_step(self, batch):
        """The example's train_step: the discriminator's update, then the generator's."""
        real_images = batch[0] if isinstance(batch, tuple) else batch
        pair, optimizers = self.model, self.optimizers()
        batch_size = keras.ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=pair.seed_generator)
        generated_images = pair.generator(random_latent_vectors)
        combined_images = keras.ops.concatenate([generated_images, real_images], axis=0)
        labels = keras.ops.concatenate([keras.ops.ones((batch_size, 1)), keras.ops.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(keras.ops.shape(labels), seed=pair.seed_generator)
        d_loss = self.manual_step(lambda: self.loss_fn(labels, pair.discriminator(combined_images)),
                                  optimizers["d"], pair.discriminator.trainable_variables)
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=pair.seed_generator)
        misleading_labels = keras.ops.zeros((batch_size, 1))
        g_loss = self.manual_step(
            lambda: self.loss_fn(misleading_labels, pair.discriminator(pair.generator(random_latent_vectors))),
            optimizers["g"], pair.generator.trainable_variables)
        self.log("train/d_loss", d_loss, prog_bar=True)
        self.log("train/g_loss", g_loss, prog_bar=True)
        return d_loss + g_loss  # logged as train/loss, not differentiated


def make_images(count: int = 512, seed: int = 0) -> np.ndarray:
    """Blurred random strokes on 28x28 (values in [0, 1]): something for the discriminator to tell apart."""
    rng = np.random.default_rng(seed)
    images = np.zeros((count, 28, 28), np.float32)
    for image in images:
        for _ in range(3):
            row, col = rng.integers(4, 24, size=2)
            image[row - 3:row + 3, col - 1:col + 1] = 1.0
    kernel = np.array([0.25, 0.5, 0.25], np.float32)
    for axis in (1, 2):
        images = np.apply_along_axis(lambda line: np.convolve(line, kernel, mode="same"), axis, images)
    return images[..., None].astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--root", default="runs/gan")
    args = parser.parse_args()
    trainer = kt.Trainer(max_steps=args.max_steps, batch_size=64, precision=args.precision,
                         default_root_dir=args.root, log_every_n_steps=10)
    trainer.fit(GAN(), train_data=make_images())
    print(f"d_loss {trainer.callback_metrics['train/d_loss']:.4f}, g_loss "
          f"{trainer.callback_metrics['train/g_loss']:.4f}, skipped steps {trainer.skipped_steps}")


if __name__ == "__main__":
    main()
