"""Per-step overhead of Trainer.fit against keras Model.fit and a hand-written loop, on TensorFlow or JAX.

The hand-written loop is a `tf.function` over a tf.data iterator on TensorFlow, and a `jax.jit` of
`model.stateless_call` + `optimizer.stateless_apply` (N batches under `lax.scan`) on JAX.
All three train the same small MLP (where Python overhead dominates) on the same numpy data,
with the same batch size and optimizer, in one process. Each runs `--epochs` epochs; the first
(tracing and compilation) is dropped and the median epoch time of the rest gives steps/s; the
three runs are repeated, interleaved, and the median of the repeats is reported.

    python benchmarks/fit_overhead.py [--backend tensorflow|jax] [--epochs 4] [--examples 16384]
                                      [--batch-size 32] [--repeats 3] [--tf-dispatch-ahead]
                                      [--layers 20,64,64,3]

Prints steps/s of each and the ratios a/b (Trainer / Model.fit) and a/c (Trainer / hand loop)
at steps_per_execution 1 and 16, and a1, the Trainer with `max_in_flight=1` (each call's outputs read
before the next call is dispatched), with a/a1: what dispatching ahead gives. On TensorFlow the window
is 1 whatever `max_in_flight` says; `--tf-dispatch-ahead` lets its runner dispatch ahead, to measure
whether that would pay there. Absolute numbers depend on the machine; compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

BACKEND = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "tensorflow"
os.environ["KERAS_BACKEND"] = BACKEND  # before Keras is imported: one backend per process
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ktrainer as kt  # noqa: E402


def make_model(layers: tuple[int, ...]) -> keras.Model:
    """An MLP of `layers` widths: input, hidden layers (relu), classes (logits)."""
    *hidden, classes = layers[1:]
    return keras.Sequential([keras.layers.Input((layers[0],)),
                             *(keras.layers.Dense(width, activation="relu") for width in hidden),
                             keras.layers.Dense(classes)])


def loss_fn(y, logits):
    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


class BenchModule(kt.Module):
    def __init__(self, layers: tuple[int, ...]):
        super().__init__()
        self.widths = layers

    def build(self):
        return make_model(self.widths)

    def configure_optimizers(self):
        return keras.optimizers.Adam(1e-3)

    def training_step(self, batch):
        x, y = batch
        return loss_fn(y, self.model(x, training=True))


class EpochTimes(kt.callbacks.Callback):
    def __init__(self):
        self.times, self._start = [], 0.0

    def on_train_epoch_start(self, trainer, module):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.times.append(time.perf_counter() - self._start)


class KerasEpochTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times, self._start = [], 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def run_trainer(data, args, spe, max_in_flight: int = 2) -> list[float]:
    timer = EpochTimes()
    trainer = kt.Trainer(max_epochs=args.epochs, batch_size=args.batch_size, steps_per_execution=spe, seed=0,
                         max_in_flight=max_in_flight, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, callbacks=[timer])
    trainer.fit(BenchModule(args.layers), train_data=data)
    return timer.times


def run_trainer_window_1(data, args, spe) -> list[float]:
    return run_trainer(data, args, spe, max_in_flight=1)


def run_keras_fit(data, args, spe) -> list[float]:
    keras.utils.set_random_seed(0)
    model = make_model(args.layers)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss_fn, steps_per_execution=spe)
    timer = KerasEpochTimes()
    model.fit(*data, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=0, callbacks=[timer])
    return timer.times


def run_hand_loop(data, args, spe) -> list[float]:
    return run_jax_loop(data, args, spe) if BACKEND == "jax" else run_tf_loop(data, args, spe)


def run_jax_loop(data, args, spe) -> list[float]:
    import jax

    keras.utils.set_random_seed(0)
    model = make_model(args.layers)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    x, y = data

    def one_step(state, batch):
        trainable, non_trainable, optimizer_values = state
        bx, by = batch

        def compute(values):
            logits, _ = model.stateless_call(values, non_trainable, bx, training=True)
            return loss_fn(by, logits)

        loss, grads = jax.value_and_grad(compute)(trainable)
        trainable, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, trainable)
        return (trainable, non_trainable, optimizer_values), loss

    @jax.jit
    def run_steps(state, batches):
        return jax.lax.scan(one_step, state, batches)

    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    times = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        order = np.random.default_rng(epoch).permutation(len(x))  # the same input pipeline as the Trainer's
        ex, ey = x[order], y[order]
        size = args.batch_size * spe
        for begin in range(0, len(x) - size + 1, size):
            batches = (ex[begin:begin + size].reshape(spe, args.batch_size, -1),
                       ey[begin:begin + size].reshape(spe, args.batch_size))
            state, losses = run_steps(state, batches)
            np.asarray(losses)
        times.append(time.perf_counter() - start)
    return times


def run_tf_loop(data, args, spe) -> list[float]:
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = make_model(args.layers)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    x, y = data
    steps = -(-len(x) // args.batch_size)

    def one_step(batch):
        bx, by = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(by, model(bx, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    @tf.function
    def run_steps(iterator, n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            loss = one_step(optional.get_value())
        return loss

    times = []
    for epoch in range(args.epochs):
        start = time.perf_counter()  # an epoch's time includes making its dataset, as in the other two
        order = np.random.default_rng(epoch).permutation(len(x))  # the same input pipeline as the Trainer's
        dataset = tf.data.Dataset.from_tensor_slices((x[order], y[order])).batch(args.batch_size)
        iterator = iter(dataset.prefetch(tf.data.AUTOTUNE))
        for _ in range(-(-steps // spe)):
            run_steps(iterator, tf.constant(spe)).numpy()
        times.append(time.perf_counter() - start)
    return times


def steps_per_second(times: list[float], steps: int) -> float:
    return steps / statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--examples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; the median is reported")
    parser.add_argument("--backend", choices=("tensorflow", "jax"), default="tensorflow")
    parser.add_argument("--layers", default="20,64,64,3",
                        help="the MLP's widths: input, hidden layers, classes (e.g. 128,256,256,10)")
    parser.add_argument("--tf-dispatch-ahead", action="store_true",
                        help="TensorFlow: let the runner dispatch ahead (window 2), which ktrainer does not do there")
    args = parser.parse_args()
    try:
        layers = tuple(int(width) for width in args.layers.split(","))
    except ValueError:
        layers = ()
    if len(layers) < 2 or min(layers) < 1:
        parser.error(f"--layers {args.layers!r}: expected comma-separated widths >= 1, input first and classes last")
    args.layers = layers
    if args.tf_dispatch_ahead and BACKEND == "tensorflow":
        from ktrainer.backends.tensorflow.steps import CompiledSteps

        CompiledSteps.dispatches_ahead = True
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.examples, args.layers[0])).astype(np.float32)
    classes = min(args.layers[-1], args.layers[0])
    data = (x, x[:, :classes].argmax(axis=1).astype(np.int32))
    steps = -(-args.examples // args.batch_size)
    engine = __import__(BACKEND)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, "
          f"{BACKEND} {engine.__version__}, keras {keras.__version__}")
    print(f"MLP {'-'.join(map(str, args.layers))}, {steps} steps/epoch of batch {args.batch_size}; "
          f"median of epochs 2..{args.epochs}, "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'spe':>4} {'a: Trainer':>12} {'a1: window 1':>13} {'b: Model.fit':>13} {'c: hand loop':>13} "
          f"{'a/b':>6} {'a1/b':>6} {'a/a1':>6} {'a/c':>6}")
    for spe in (1, 16):
        rates = {run: [] for run in (run_trainer, run_trainer_window_1, run_keras_fit, run_hand_loop)}
        for _ in range(args.repeats):  # interleaved, so a noisy neighbour hits all four alike
            for run, found in rates.items():
                found.append(steps_per_second(run(data, args, spe), steps))
        a, a1, b, c = (statistics.median(found) for found in rates.values())
        print(f"{spe:>4} {a:>12.1f} {a1:>13.1f} {b:>13.1f} {c:>13.1f} "
              f"{a / b:>6.2f} {a1 / b:>6.2f} {a / a1:>6.2f} {a / c:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
