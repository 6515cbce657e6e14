"""One leg of a resume test, in a fresh process: `python resume_run.py ROOT MAX_STEPS PRECISION [CKPT] [OPTIONS_JSON]`.

Prints a JSON object: the (step, loss) pairs it trained and the path of its final weights.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import ktrainer as kt


class Net(kt.Module):
    """Dropout (random state), Adam (slots), numpy data (shuffled per epoch), validation."""

    def build(self):
        return keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dropout(0.3), keras.layers.Dense(3, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.Adam(0.01)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def validation_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, self.model(x), from_logits=True))

    def train_data(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(160, 6)).astype("float32")
        return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0.5).astype("int32")

    def val_data(self):
        x, y = self.train_data()
        return x[:40], y[:40]


class Losses(kt.callbacks.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.losses.append([trainer.global_step, metrics["train/loss_step"]])


if __name__ == "__main__":
    root, max_steps, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ckpt = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    losses = Losses()
    callbacks = [losses]
    if os.environ.get("KTRAINER_TEST_SAVE_EVERY_STEP"):  # the kill test: a save in progress most of the time
        callbacks.append(kt.callbacks.ModelCheckpoint(every_n_train_steps=1, max_to_keep=2))
    trainer = kt.Trainer(max_steps=max_steps, batch_size=32, seed=7, precision=precision, default_root_dir=root,
                         callbacks=callbacks, enable_progress_bar=False, log_every_n_steps=1,
                         storage_options=options)
    module = Net()
    trainer.fit(module, ckpt_path=ckpt)
    weights_file = os.path.abspath(f"weights-{os.getpid()}.npz")  # the test runs us in a temporary folder
    np.savez(weights_file, *[v.numpy() for v in module.model.variables])
    print(json.dumps({"losses": losses.losses, "weights": weights_file, "step": trainer.global_step,
                      "epoch": trainer.current_epoch, "scale": float(trainer.optimizer.dynamic_scale.numpy())
                      if precision == "16-mixed" else None}))
