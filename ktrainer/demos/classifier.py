"""The demo module: a small MLP on a synthetic, learnable classification set (no download)."""

from __future__ import annotations

import keras
import numpy as np

from ktrainer.module import Module

__all__ = ["DemoClassifier", "make_classification"]


def make_classification(num_examples: int = 4000, num_features: int = 20, num_classes: int = 3,
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters, one per class, with overlap: learnable to about 95%, not to 100%.

    Args:
        num_examples: Number of examples.
        num_features: Features per example.
        num_classes: Number of classes.
        seed: The data's random seed (the same seed gives the same data).

    Returns:
        `(x, y)`: float32 features of shape (num_examples, num_features), int32 labels.
    """
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, size=(num_classes, num_features))
    labels = rng.integers(0, num_classes, size=num_examples)
    features = centers[labels] + rng.normal(0.0, 1.5, size=(num_examples, num_features))
    return features.astype(np.float32), labels.astype(np.int32)


class DemoClassifier(Module):
    """A 2-layer MLP classifier with accuracy logging, trained on `make_classification` data.

    Args:
        lr: Adam learning rate.
        hidden: Hidden units.
        num_examples: Size of the generated data set (80% train, 20% validation).
        num_features: Input features.
        num_classes: Classes.
        data_seed: Seed of the generated data.
    """

    def __init__(self, lr: float = 1e-3, hidden: int = 64, num_examples: int = 4000, num_features: int = 20,
                 num_classes: int = 3, data_seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.hidden = lr, hidden
        self.num_features, self.num_classes = num_features, num_classes
        x, y = make_classification(num_examples, num_features, num_classes, data_seed)
        split = int(0.8 * num_examples)
        self._train, self._val = (x[:split], y[:split]), (x[split:], y[split:])

    def build(self) -> keras.Model:
        """An MLP whose output layer computes in float32."""
        return keras.Sequential([
            keras.layers.Input((self.num_features,)),
            keras.layers.Dense(self.hidden, activation="relu"),
            keras.layers.Dense(self.hidden, activation="relu"),
            keras.layers.Dense(self.num_classes, dtype="float32"),
        ])

    def configure_optimizers(self) -> keras.optimizers.Optimizer:
        """Adam at `lr`."""
        return keras.optimizers.Adam(self.lr)

    def _loss_and_accuracy(self, batch, training: bool):
        x, y = batch
        logits = self.model(x, training=training)
        loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        accuracy = keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits))
        return loss, accuracy

    def training_step(self, batch):
        """Cross-entropy loss; logs train/acc."""
        loss, accuracy = self._loss_and_accuracy(batch, training=True)
        self.log("train/acc", accuracy, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch):
        """Logs val/acc; the returned loss is logged as val/loss."""
        loss, accuracy = self._loss_and_accuracy(batch, training=False)
        self.log("val/acc", accuracy, prog_bar=True)
        return loss

    def test_step(self, batch):
        """Logs test/acc; the returned loss is logged as test/loss."""
        loss, accuracy = self._loss_and_accuracy(batch, training=False)
        self.log("test/acc", accuracy)
        return loss

    def train_data(self):
        """80% of the generated examples."""
        return self._train

    def val_data(self):
        """The other 20%."""
        return self._val

    def test_data(self):
        """The validation split (the demo has no separate test set)."""
        return self._val
