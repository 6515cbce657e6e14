"""What summing an Embedding gradient's duplicate rows costs on TensorFlow, and what it is worth, in one process.

    python benchmarks/sparse_gradients.py [--steps 60] [--repeats 5] [--batch-size 32]

A miniature GPT (token and position Embeddings, one causal self-attention block, a Dense over the
vocabulary; Zipf-distributed tokens, so frequent tokens repeat in every batch) under AdamW, with
one hand-written `tf.function` step handing the optimizer its gradients three ways:

- "as Keras": the `IndexedSlices` as `GradientTape` gives it (one row per lookup), which Keras 3's
  TensorFlow optimizers apply row by row (what `model.fit` does);
- "rows summed": `ktrainer.backends.tensorflow.gradients.sum_duplicate_rows` first (one row per
  index, still sparse: what the Trainer does);
- "dense": every gradient densified (the math of the gradient, what the JAX engine gets).

It prints steps/s of each (median over `--repeats` interleaved timings of `--steps` steps, as
ratios against "as Keras"), the bytes of the token table's gradient each way, and how far the
"as Keras" and "rows summed" runs end from the dense one after 16 steps from the same weights.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ktrainer.backends.tensorflow.gradients import sum_duplicate_rows  # noqa: E402

VOCABULARY, LENGTH, WIDTH, HEADS = 2000, 40, 64, 2
WAYS = {
    "as Keras": lambda g: g,
    "rows summed": sum_duplicate_rows,
    "dense": lambda g: tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g,
}


class TokenAndPosition(keras.layers.Layer):
    """A token Embedding plus a position Embedding."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(VOCABULARY, WIDTH, name="tokens")
        self.positions = keras.layers.Embedding(LENGTH, WIDTH, name="positions")

    def call(self, x):
        return self.tokens(x) + self.positions(keras.ops.arange(LENGTH))


def miniature_gpt() -> keras.Model:
    """The keras.io miniature GPT's shape, smaller: one causal transformer block."""
    tokens = keras.Input((LENGTH,), dtype="int32")
    x = TokenAndPosition()(tokens)
    attended = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(x, x, use_causal_mask=True)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + attended)
    fed = keras.layers.Dense(WIDTH)(keras.layers.Dense(2 * WIDTH, activation="relu")(x))
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + fed)
    return keras.Model(tokens, keras.layers.Dense(VOCABULARY)(x))


def text(batches: int, batch_size: int) -> np.ndarray:
    """Zipf-distributed tokens (a word's frequency falls with its rank), `batches` x `batch_size` sequences."""
    rng = np.random.default_rng(0)
    return (np.minimum(rng.zipf(1.3, size=(batches * batch_size, LENGTH + 1)), VOCABULARY) - 1).astype("int32")


def trainer(way, weights: list[np.ndarray]):
    """A model from `weights`, AdamW, and its compiled step handing the optimizer gradients `way`."""
    model = miniature_gpt()
    model.set_weights(weights)
    optimizer = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=False)
    def step(sequence):
        with tf.GradientTape() as tape:
            loss = loss_fn(sequence[:, 1:], model(sequence[:, :-1], training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply([way(g) for g in gradients], model.trainable_variables)
        return loss

    return model, step


def table_gradient_bytes(weights: list[np.ndarray], batch: np.ndarray) -> dict[str, int]:
    """The bytes of the token table's gradient: one row per lookup, one per distinct token, and the whole table."""
    model = miniature_gpt()
    model.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(batch[:, 1:], model(batch[:, :-1]))
    table = next(v for v in model.trainable_variables if v.path.endswith("tokens/embeddings"))
    gradient = tape.gradient(loss, table)
    row = WIDTH * 4
    return {"as Keras": int(gradient.indices.shape[0]) * row,
            "rows summed": int(sum_duplicate_rows(gradient).indices.shape[0]) * row, "dense": VOCABULARY * row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    weights = miniature_gpt().get_weights()
    data = tf.constant(text(args.steps, args.batch_size))
    batches = [data[i * args.batch_size:(i + 1) * args.batch_size] for i in range(args.steps)]
    print(f"# {platform.node()} {platform.machine()} {os.cpu_count()} cpus, TensorFlow {tf.__version__}, "
          f"Keras {keras.__version__}; GPT vocabulary {VOCABULARY}, {LENGTH} tokens, width {WIDTH}, "
          f"batch {args.batch_size}")

    runs = {name: trainer(way, weights) for name, way in WAYS.items()}
    losses = {name: [float(step(batch)) for batch in batches[:16]] for name, (_, step) in runs.items()}
    dense_weights = runs["dense"][0].get_weights()
    print("\nafter 16 steps from the same weights, against dense (the math):")
    for name in ("as Keras", "rows summed"):
        loss_gap = max(abs(a - b) for a, b in zip(losses[name], losses["dense"], strict=True))
        weight_gap = max(float(np.max(np.abs(a - b))) for a, b in zip(runs[name][0].get_weights(), dense_weights,
                                                                         strict=True))
        print(f"  {name:12s} loss {loss_gap:.2e}   weights {weight_gap:.2e}")

    timings: dict[str, list[float]] = {name: [] for name in WAYS}
    for _ in range(args.repeats):  # interleaved, so a noisy neighbour slows every way alike
        for name, (_, step) in runs.items():
            began = time.perf_counter()
            for batch in batches:
                loss = step(batch)
            float(loss)
            timings[name].append(args.steps / (time.perf_counter() - began))
    baseline = statistics.median(timings["as Keras"])
    sizes = table_gradient_bytes(weights, batches[0].numpy())
    print(f"\n{'gradient':12s} {'steps/s':>8s} {'ratio':>6s}   token table's gradient")
    for name, rates in timings.items():
        rate = statistics.median(rates)
        print(f"{name:12s} {rate:8.1f} {rate / baseline:6.2f}   {sizes[name] / 1024:7.1f} KiB")


if __name__ == "__main__":
    main()
