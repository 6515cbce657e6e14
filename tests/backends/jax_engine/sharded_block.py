"""The model the sharding tests train: a transformer block (Embedding, MultiHeadAttention, Dense), its data, a fit
that records every step's loss, and the bytes each device holds read from the arrays' shardings."""

from __future__ import annotations

from collections import defaultdict

import keras
import numpy as np

import ktrainer as kt

VOCAB, LENGTH, WIDTH = 64, 8, 32
GLOBAL_BATCH = 64

# Every kernel, the embedding and most biases split over "model"; the LayerNorm and one bias stay replicated.
MODEL_LAYOUT = {  # each split dimension divides by 2, 4 and 8: the same layout fits every mesh of 8 devices
    "emb/embeddings": (None, "model"),
    "mha/(query|key|value)/kernel": (None, None, "model"),
    "mha/(query|key|value)/bias": (None, "model"),
    "mha/attention_output/kernel": (None, None, "model"),
    "mha/attention_output/bias": ("model",),
    "up/kernel": (None, "model"),
    "up/bias": ("model",),
    "down/kernel": ("model", None),
    "head/kernel": (None, "model"),
    "head/bias": ("model",),
}


class TransformerBlock(kt.Module):
    """Embedding -> self-attention -> LayerNorm -> MLP -> a classifier of the next token."""

    def __init__(self, layout: dict | None = None) -> None:
        super().__init__()
        self.layout = layout

    def configure_layout(self, mesh):
        return self.layout

    def build(self):
        tokens = keras.Input((LENGTH,), dtype="int32")
        x = keras.layers.Embedding(VOCAB, WIDTH, name="emb")(tokens)
        x = keras.layers.LayerNormalization(name="ln")(x + keras.layers.MultiHeadAttention(4, 8, name="mha")(x, x))
        x = x + keras.layers.Dense(WIDTH, name="down")(keras.layers.Dense(2 * WIDTH, activation="relu", name="up")(x))
        logits = keras.layers.Dense(VOCAB, name="head")(keras.layers.GlobalAveragePooling1D()(x))
        return keras.Model(tokens, logits, name="block")

    def configure_optimizers(self):
        return keras.optimizers.Adam(1e-2)

    def training_step(self, batch):
        tokens, target = batch
        logits = self.model(tokens, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(target, logits, from_logits=True))


def data(examples: int = 2 * GLOBAL_BATCH) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.integers(0, VOCAB, (examples, LENGTH)).astype("int32"),
            rng.integers(0, VOCAB, (examples,)).astype("int32"))


class _Losses(kt.callbacks.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch_idx):
        self.losses.append(float(outputs["train/loss_step"]))


def fit(module: kt.Module, tmp_path, steps: int = 4, ckpt_path: str | None = None, callbacks: list | None = None,
        **arguments) -> tuple[list[float], kt.Trainer]:
    """Train `module` `steps` steps on `data()` in order (no checkpoints unless `enable_checkpointing=True`)."""
    keras.utils.set_random_seed(1)
    losses = _Losses()
    settings = {"enable_progress_bar": False, "logger": False, "enable_checkpointing": False, **arguments}
    trainer = kt.Trainer(max_steps=steps, default_root_dir=str(tmp_path), callbacks=[losses, *(callbacks or [])],
                         **settings)
    trainer.fit(module, data(), shuffle=False, ckpt_path=ckpt_path)
    return losses.losses, trainer


def held_per_device(trainer: kt.Trainer, module: kt.Module) -> tuple[int, int]:
    """(bytes on the most loaded device, bytes of the whole state) of weights + optimizer state, from the shards."""
    arrays = [v.value for v in module.model.variables] + [v.value for v in trainer.optimizer.variables]
    held: dict = defaultdict(int)
    for array in arrays:
        for shard in array.addressable_shards:
            held[shard.device] += shard.data.nbytes
    assert len(held) == 8
    return max(held.values()), sum(array.nbytes for array in arrays)
