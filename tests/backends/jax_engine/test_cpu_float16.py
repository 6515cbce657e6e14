""""16-mixed" on XLA's CPU backend: a float16 matmul it lacks is ktrainer's clear error before anything runs."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt

pytestmark = pytest.mark.jax_only


class Attention(kt.Module):
    def build(self):
        inputs = keras.Input((8, 16))
        attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inputs, inputs)
        pooled = keras.layers.GlobalAveragePooling1D()(attended)
        return keras.Model(inputs, keras.layers.Dense(3, dtype="float32")(pooled))

    def configure_optimizers(self):
        return keras.optimizers.Adam(1e-3)

    def train_data(self):
        rng = np.random.default_rng(0)
        return rng.normal(size=(32, 8, 16)).astype("float32"), rng.integers(0, 3, 32)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def fit(root, precision):
    trainer = kt.Trainer(precision=precision, max_steps=2, batch_size=16, default_root_dir=str(root),
                         enable_progress_bar=False)
    trainer.fit(Attention())
    return trainer


def test_float16_attention_on_a_cpu_is_refused_in_ktrainers_words_before_anything_is_written(tmp_path):
    root = tmp_path / "run"
    with pytest.raises(ValueError) as refused:
        fit(root, "16-mixed")
    message = str(refused.value)
    assert message.startswith("precision='16-mixed': the training step does not compile on this CPU.")
    assert "XLA's CPU backend lacks this float16 matmul" in message
    assert 'Use precision="bf16-mixed" or "32-true" on a CPU; "16-mixed" is for GPUs.' in message
    assert not root.exists()  # no logs, no checkpoints: nothing was written
    assert fit(tmp_path / "bf16", "bf16-mixed").global_step == 2  # the advice works
