"""Runs in its own process with 4 logical CPU devices; prints one JSON object of results.

The checks that need another device layout than the test process (one layout per process).
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import ktrainer as kt
from ktrainer.callbacks.lr_monitor import current_learning_rate

trainer_for_devices = kt.Trainer(devices=4, logger=False, enable_progress_bar=False)  # splits the CPU first


class Losses(kt.callbacks.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.losses.append(metrics["train/loss_step"])


class Net(kt.Module):
    def __init__(self, loss_kind):
        super().__init__()
        self.loss_kind = loss_kind

    def build(self):
        return keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                 keras.layers.Dense(3, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.SGD(0.2)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        self.log("train/x_mean", keras.ops.mean(x))
        if self.loss_kind == "keras_losses":
            return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def validation_step(self, batch):
        x, y = batch
        self.log("val/x_sum_mean", keras.ops.mean(keras.ops.sum(x, axis=1)))
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, self.model(x))


def data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32)


def equivalence(loss_kind):
    runs = {}
    for devices, batch in ((1, 32), (4, 8)):
        losses = Losses()
        module = Net(loss_kind)
        trainer = kt.Trainer(devices=devices, batch_size=batch, max_steps=24, seed=5, callbacks=[losses],
                             logger=False, enable_progress_bar=False)
        trainer.fit(module, train_data=data())
        runs[devices] = {"losses": losses.losses, "weights": [w.tolist() for w in module.model.get_weights()],
                         "global_batch": trainer.global_batch_size,
                         "x_mean": trainer.callback_metrics["train/x_mean"]}
    return runs


def skip_on_one_replica():
    x, y = data(64)
    x[3 * 16 + 12, 0] = np.inf  # step 3, the second replica's half of the global batch of 16
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    snapshots = []

    class Snap(kt.callbacks.Callback):
        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            per_device = [[np.asarray(c).tolist() for c in trainer.strategy.experimental_local_results(v.value)]
                          for v in module.model.trainable_variables]
            snapshots.append({"per_device": per_device, "skipped": trainer.skipped_steps,
                              "scale": float(trainer.optimizer.dynamic_scale.numpy())})

    trainer = kt.Trainer(devices=2, batch_size=8, max_epochs=1, callbacks=[Snap()], logger=False,
                         enable_progress_bar=False,
                         precision=kt.precision.MixedPrecision("16-mixed", initial_scale=1024.0))
    trainer.fit(Net("ops"), train_data=dataset)
    return {"snapshots": snapshots, "replicas": trainer.strategy.num_replicas_in_sync}


def lr_scaling():
    rates = {}
    for scaling in (None, "sqrt", "linear"):
        trainer = kt.Trainer(devices=4, batch_size=8, max_steps=1, lr_scaling=scaling, logger=False,
                             enable_progress_bar=False)
        trainer.fit(Net("ops"), train_data=data(64))
        rates[str(scaling)] = current_learning_rate(trainer.optimizer)

    class Scheduled(Net):
        def configure_optimizers(self):
            return keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5))

    trainer = kt.Trainer(devices=4, batch_size=8, max_steps=2, lr_scaling="linear", logger=False,
                         enable_progress_bar=False)
    trainer.fit(Scheduled("ops"), train_data=data(64))
    rates["schedule_linear_after_2_steps"] = current_learning_rate(trainer.optimizer)
    return rates


def exact_validation():
    x, y = data(37, seed=3)
    trainer = kt.Trainer(devices=4, batch_size=8, max_steps=1, logger=False, enable_progress_bar=False)
    module = Net("ops")
    trainer.fit(module, train_data=data(64))
    metrics = trainer.validate(module, data=(x, y))
    logits = module.model(x).numpy()
    expected_loss = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits).numpy())
    return {"metrics": metrics, "expected_x_sum_mean": float(x.sum(axis=1).mean()), "expected_loss": expected_loss}


def device_errors():
    errors = {}
    for kwargs in ({"devices": 8}, {"devices": [0, 5]}):
        try:
            kt.Trainer(**kwargs)
        except ValueError as error:
            errors[str(kwargs)] = str(error)
    return errors


def zero_steps() -> str:
    """40 examples on 4 replicas of 16: a global batch of 64, and the incomplete batch is dropped."""
    try:
        kt.Trainer(devices=4, batch_size=16, max_epochs=1, logger=False, enable_progress_bar=False,
                   enable_checkpointing=False).fit(Net("ops"), train_data=data(40))
    except ValueError as error:
        return str(error)
    return "no error"


if __name__ == "__main__":
    results = {"keras_losses": equivalence("keras_losses"), "ops": equivalence("ops"),
               "skip": skip_on_one_replica(), "lr": lr_scaling(), "validation": exact_validation(),
               "logical_cpus": len(tf.config.list_logical_devices("CPU")), "errors": device_errors(),
               "zero_steps": zero_steps()}
    json.dump(results, sys.stdout)
