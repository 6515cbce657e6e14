"""An Embedding's sparse gradient reaches the optimizer sparse: through loss unscaling, the non-finite check,
clipping and the cross-replica decision (a dense one would be the whole table, in memory and in the update)."""

from __future__ import annotations

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import ktrainer as kt


class RecordingAdam(keras.optimizers.Adam):
    """Adam that notes the kind of each gradient it is given."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kinds = {}

    def apply(self, grads, trainable_variables=None):
        for gradient, variable in zip(grads, trainable_variables or self._trainable_variables, strict=True):
            self.kinds[variable.path] = type(gradient).__name__
        return super().apply(grads, trainable_variables)


class Text(kt.Module):
    def build(self):
        return keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(1000, 8, name="table"),
                                 keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1, dtype="float32")])

    def configure_optimizers(self):
        self.adam = RecordingAdam(learning_rate=0.01)
        return self.adam

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.losses.mean_squared_error(y, self.model(x, training=True)))

    def train_data(self):
        rng = np.random.default_rng(0)
        return rng.integers(0, 1000, size=(64, 6)).astype("int32"), rng.normal(size=(64, 1)).astype("float32")


def gradient_kinds(**arguments) -> tuple[str, str]:
    """The kind of gradient the optimizer was given for the embedding table and for the last kernel."""
    module = Text()
    kt.Trainer(max_steps=2, batch_size=16, logger=False, enable_progress_bar=False, enable_checkpointing=False,
               **arguments).fit(module)
    table = next(v.path for v in module.model.trainable_variables if "table" in v.path)
    return module.adam.kinds[table], module.adam.kinds[module.model.layers[-1].kernel.path]


@pytest.mark.parametrize("arguments", [
    {"precision": "16-mixed"},
    {"precision": "16-mixed", "gradient_clip_val": 0.5},
], ids=["unscaled", "clipped"])
def test_an_embeddings_gradient_reaches_the_optimizer_sparse(arguments):
    table, kernel = gradient_kinds(**arguments)
    assert table == tf.IndexedSlices.__name__
    assert kernel != tf.IndexedSlices.__name__


def test_an_embeddings_gradient_stays_sparse_across_two_replicas(tmp_path):
    # Two logical CPUs need a process of their own (a TensorFlow process has one device layout).
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    table, kernel = json.loads(done.stdout.strip().splitlines()[-1])
    assert table == tf.IndexedSlices.__name__
    assert kernel != tf.IndexedSlices.__name__


if __name__ == "__main__":
    print(json.dumps(gradient_kinds(precision="16-mixed", devices=2, gradient_clip_val=0.5)))
