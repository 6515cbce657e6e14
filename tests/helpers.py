"""Tiny modules and data for the tests, and reading back what loggers wrote."""

from __future__ import annotations

import glob
import os

import keras
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

import ktrainer as kt

__all__ = ["Regressor", "Classifier", "regression_data", "read_scalars", "read_hparams"]


class Regressor(kt.Module):
    """y = x @ w: one Dense layer, SGD, mean squared error. Small enough to check by hand."""

    def __init__(self, lr: float = 0.1, features: int = 4, optimizer: str = "sgd"):
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.features, self.optimizer_name = lr, features, optimizer

    def build(self):
        return keras.Sequential([keras.layers.Input((self.features,)),
                                 keras.layers.Dense(1, kernel_initializer="zeros", bias_initializer="zeros")])

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return keras.optimizers.Adam(self.lr)
        return keras.optimizers.SGD(self.lr)

    def training_step(self, batch):
        x, y = batch
        prediction = self.model(x, training=True)[:, 0]
        return keras.ops.mean(keras.ops.square(prediction - y))

    def validation_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))


def regression_data(n: int = 64, features: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Linear data with a little noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    w = np.arange(1, features + 1, dtype=np.float32)
    y = (x @ w + 0.1 * rng.normal(size=n)).astype(np.float32)
    return x, y


class Classifier(kt.Module):
    """The issue's quick-start classifier, on random 20-feature data with 3 classes."""

    def __init__(self, lr: float = 1e-2, n: int = 256):
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        rng = np.random.default_rng(1)
        self.x = rng.normal(size=(n, 20)).astype(np.float32)
        self.y = (self.x[:, 0] > 0).astype(np.int32) + (self.x[:, 1] > 1).astype(np.int32)

    def build(self):
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(3, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.Adam(self.lr)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        self.log("train/acc", keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits)))
        return loss

    def validation_step(self, batch):
        x, y = batch
        logits = self.model(x)
        self.log("val/acc", keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits)))
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def train_data(self):
        return self.x, self.y

    def val_data(self):
        return self.x[:64], self.y[:64]


def read_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under `log_dir`: tag -> [(step, value), ...]."""
    assert glob.glob(os.path.join(log_dir, "events.out.tfevents.*")), f"no event file in {log_dir}"
    accumulator = EventAccumulator(log_dir, size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    scalars = {}
    for tag in accumulator.Tags()["tensors"]:
        values = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in accumulator.Tensors(tag)]
        if values and all(v.size == 1 and v.dtype.kind == "f" for _, v in values):
            scalars[tag] = [(step, float(v.reshape(()))) for step, v in values]
    return scalars


def read_hparams(log_dir: str) -> dict:
    """The hyperparameters written for TensorBoard's HPARAMS tab under `log_dir`."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    accumulator = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    accumulator.Reload()
    content = accumulator.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in info.hparams.items()}
