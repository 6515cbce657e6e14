"""A whole JAX run, in a process where TensorFlow is installed, noting who (if anyone) imports it.

    KERAS_BACKEND=jax python tensorflow_watch_run.py ROOT [--import-tensorflow-first]

Trains with a seed, the default TensorBoard logger, checkpoints (each exported as .keras), a scaled
learning-rate schedule and 16-mixed; stops, resumes from "last", validates a checkpoint, predicts, and
exports the last checkpoint with `ktrainer ckpt export`. Prints `RESULT {json}`: where TensorFlow was first
imported (the stack, or None); with --import-tensorflow-first (as a user's tf.data pipeline would), it only
trains one step and says whether the seed reached TensorFlow's random generator.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import traceback


class WatchTensorFlow(importlib.abc.MetaPathFinder):
    """Notes the stack of the first `tensorflow` import, and lets it happen."""

    first: str | None = None

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" and WatchTensorFlow.first is None:
            WatchTensorFlow.first = "".join(traceback.format_stack(limit=25))
        return None


sys.meta_path.insert(0, WatchTensorFlow())
tensorflow_first = "--import-tensorflow-first" in sys.argv
if tensorflow_first:
    import tensorflow as tf  # noqa: F401 - as a script that builds a tf.data pipeline would

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ktrainer as kt  # noqa: E402
from ktrainer.cli.main import main as ktrainer_command  # noqa: E402


class Net(kt.Module):
    def build(self):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                 keras.layers.Dropout(0.1), keras.layers.Dense(1)])

    def configure_optimizers(self):
        return keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-2, 10, 0.9))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = keras.ops.mean((self.model(x, training=True) - y) ** 2)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", keras.ops.mean((self.model(x) - y) ** 2))


def trainer(**limits):
    return kt.Trainer(batch_size=8, seed=3, default_root_dir=sys.argv[1], precision="16-mixed",
                      lr_scaling="linear", enable_progress_bar=False,
                      callbacks=[kt.callbacks.ModelCheckpoint(export_keras=True)], **limits)


x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
if tensorflow_first:  # only the seed is in question: one step
    trainer(max_steps=1, logger=False).fit(Net(), (x, y))
    drawn = float(tf.random.uniform(()))
    tf.random.set_seed(3)
    seeded = drawn == float(tf.random.uniform(()))  # the Trainer's seed=3 had set TensorFlow's global seed
    print("RESULT", json.dumps({"tensorflow_seeded": seeded}), flush=True)
    sys.exit(0)
trainer(max_steps=5).fit(Net(), (x, y), (x, y))
resumed = trainer(max_epochs=2)
resumed.fit(Net(), (x, y), (x, y), ckpt_path="last")
resumed.validate(Net(), (x, y), ckpt_path="last")
resumed.predict(resumed.module, x)
exported = ktrainer_command(["ckpt", "export", f"{sys.argv[1]}/checkpoints", f"{sys.argv[1]}/model.keras"])
print("RESULT", json.dumps({"step": resumed.global_step, "exported": exported, "first_import": WatchTensorFlow.first}),
      flush=True)
