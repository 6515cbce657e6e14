"""Training legs of a model with sparse gradients (two Embeddings, every batch repeating their rows), on whichever
backend this process runs (KERAS_BACKEND), for tests/backends/test_sparse_gradients.py.

    python sparse_run.py JSON_LEGS

A leg's arguments (JSON): optimizer (a name of OPTIMIZERS), devices, batch_size (global), steps, precision,
initial_scale, accumulate, clip, manual, root and ckpt (checkpoints; none without root), max_steps (stop early).
Prints one JSON list, one result per leg: the step losses, the final weights, skipped steps, the loss scale, and
(on TensorFlow) what the optimizer was handed: each sparse gradient's row count and distinct indices per call.
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np

import ktrainer as kt

VOCABULARY, LENGTH, WIDTH = 40, 6, 4
OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adam_ema": lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_momentum=0.5),
}


class Inspected:
    """An optimizer mixin that notes what each `apply` is handed (on TensorFlow): for a sparse gradient, its number
    of rows and of distinct indices, as the step runs; the paths of the variables whose gradient is dense."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sparse_rows: dict[str, list[list[int]]] = {}
        self.dense_paths: set[str] = set()

    def apply(self, grads, trainable_variables=None):
        if keras.config.backend() == "tensorflow":
            import tensorflow as tf

            for gradient, variable in zip(grads, trainable_variables or self._trainable_variables, strict=True):
                if isinstance(gradient, tf.IndexedSlices):
                    rows = self.sparse_rows.setdefault(variable.path, [])
                    tf.numpy_function(lambda indices, rows=rows: rows.append(
                        [len(indices), len(set(indices.tolist()))]) or (), [gradient.indices], [])
                else:
                    self.dense_paths.add(variable.path)
        return super().apply(grads, trainable_variables)


def inspected(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The same optimizer (class and configuration), inspected (see `Inspected`)."""
    kind = type(optimizer)
    return type(f"Inspected{kind.__name__}", (Inspected, kind), {}).from_config(optimizer.get_config())


class TokensAndPositions(keras.layers.Layer):
    """A token Embedding plus a position Embedding (every example looks up every position), summed."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(VOCABULARY, WIDTH, name="tokens")
        self.positions = keras.layers.Embedding(LENGTH, WIDTH, name="positions")

    def call(self, x):
        positions = keras.ops.broadcast_to(keras.ops.arange(LENGTH), keras.ops.shape(x))
        return self.tokens(x) + self.positions(positions)


def build_model() -> keras.Model:
    """The model, from the same initial weights on every backend (numpy draws them)."""
    model = keras.Sequential([keras.Input((LENGTH,), dtype="int32"), TokensAndPositions(),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1, dtype="float32")])
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def loss_of(model: keras.Model, x, y, training: bool = True):
    """The mean squared error of the model on (x, y)."""
    return keras.ops.mean(keras.ops.square(model(x, training=training) - y))


def data(steps: int = 16, batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """`steps` batches of tokens from a small vocabulary (each batch repeats tokens) and their targets."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, VOCABULARY, size=(steps * batch_size, LENGTH)).astype("int32")
    return x, (np.sin(x).mean(axis=1, keepdims=True) + (x[:, :1] > 5)).astype("float32")


class Tokens(kt.Module):
    """The model under one of OPTIMIZERS; with `manual`, updated by `self.manual_step` (manual optimization)."""

    def __init__(self, optimizer: str = "adam", manual: bool = False):
        super().__init__()
        self.optimizer_name = optimizer
        self.automatic_optimization = not manual

    def build(self):
        return build_model()

    def configure_optimizers(self):
        self.inspected = inspected(OPTIMIZERS[self.optimizer_name]())
        return self.inspected

    def training_step(self, batch):
        x, y = batch
        if self.automatic_optimization:
            return loss_of(self.model, x, y)
        return self.manual_step(lambda: loss_of(self.model, x, y), self.optimizers())


class Record(kt.callbacks.Callback):
    """Every step's loss, as a user's callback sees it."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch_idx):
        self.losses.append(float(outputs["train/loss_step"]))


def leg(args: dict) -> dict:
    """Train one leg (see the module docstring) and report what it did."""
    precision = args.get("precision", "32-true")
    if args.get("initial_scale"):
        precision = kt.precision.MixedPrecision(precision, initial_scale=args["initial_scale"])
    record = Record()
    root = args.get("root")
    trainer = kt.Trainer(max_steps=args.get("max_steps"), max_epochs=1, batch_size=args.get("batch_size", 16)
                         // args.get("devices", 1), devices=args.get("devices", 1), precision=precision,
                         accumulate_grad_batches=args.get("accumulate", 1), gradient_clip_val=args.get("clip"),
                         callbacks=[record], default_root_dir=root or ".", enable_checkpointing=root is not None,
                         logger=False, enable_progress_bar=False, log_every_n_steps=1)
    module = Tokens(args.get("optimizer", "adam"), args.get("manual", False))
    trainer.fit(module, data(args.get("steps", 16), args.get("batch_size", 16)), shuffle=False,
                ckpt_path=args.get("ckpt"))
    return {"backend": keras.config.backend(), "losses": record.losses, "step": trainer.global_step,
            "weights": [np.asarray(w).tolist() for w in module.model.get_weights()],
            "skipped": trainer.skipped_steps, "loss_scale": trainer.callback_metrics.get("precision/loss_scale"),
            "replicas": trainer.num_replicas, "sparse_rows": module.inspected.sparse_rows,
            "dense_paths": sorted(module.inspected.dense_paths)}


if __name__ == "__main__":
    legs = json.loads(sys.argv[1])
    if keras.config.backend() == "tensorflow" and max(each.get("devices", 1) for each in legs) > 1:
        kt.Trainer(devices=max(each.get("devices", 1) for each in legs))  # split the CPU before TensorFlow starts
    print(json.dumps([leg(each) for each in legs]))
