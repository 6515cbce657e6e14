"""Where the Trainer's time goes on JAX at one batch per call: the compiled step, the wait for its outputs, the loop.

    KERAS_BACKEND=jax python benchmarks/jax_step_split.py [--tiny]

On the GPU check's MLP (bf16-mixed, batch 1024, width 8192; `--tiny` for a CPU run of the script), in one
process, steps per second of:
- Keras's jitted `train_step` and ktrainer's jitted training step, each called back to back on one placed
  batch without reading anything (the device's time per step), then reading each step's outputs before the
  next call (what waiting on every step costs);
- ktrainer's step read and written back as the runner does (`read_state`/`write_small`);
- whole Trainer fits at steps_per_execution 1, bare and with the ThroughputMonitor and a CSV logger.
Against Keras `fit` (`gpu_check.py`), this splits the Trainer's gap into the step, the wait, and the loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from gpu_check import MLP, make_model, trainer_rate  # noqa: E402

import ktrainer as kt  # noqa: E402


def steps_per_second(run, steps: int, repeats: int = 3) -> float:
    """Median rate of `run(steps)` after a warm-up call."""
    run(8)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(steps)
        times.append(time.perf_counter() - start)
    return steps / statistics.median(times)


def keras_step(x, y, sizes) -> tuple:
    """Keras's own jitted train step and its state, after a `fit` that built everything."""
    features, width, depth, batch = sizes
    keras.config.set_dtype_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    model = make_model(features, width, depth)
    keras.config.set_dtype_policy("float32")
    model.compile(keras.optimizers.Adam(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:batch * 2], y[:batch * 2], batch_size=batch, epochs=1, verbose=0)
    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in model.optimizer.variables], [v.value for v in model.metrics_variables])
    return jax.jit(model.train_step, donate_argnums=0), state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small sizes, for a CPU run of the script")
    args = parser.parse_args()
    features, width, depth, batch, steps = (32, 64, 2, 16, 16) if args.tiny else (256, 8192, 4, 1024, 64)
    x = np.random.default_rng(0).normal(size=(batch * steps, features)).astype("float32")
    y = x[:, :16].argmax(axis=1).astype("int32")
    device = jax.devices()[0]
    print(f"{device.platform} {device.device_kind}, jax {jax.__version__}, keras {keras.__version__}", flush=True)
    placed = jax.device_put((x[:batch], y[:batch]), device)
    results = {}

    step, state = keras_step(x, y, (features, width, depth, batch))
    keras_state = [state]

    def keras_calls(count: int, wait: bool = False) -> None:
        for _ in range(count):
            logs, keras_state[0] = step(keras_state[0], placed)
            if wait:
                np.asarray(logs["loss"])
        jax.block_until_ready(keras_state[0])

    results["Keras step, back to back"] = steps_per_second(keras_calls, steps)
    results["Keras step, each output read"] = steps_per_second(lambda n: keras_calls(n, True), steps)

    trainer = kt.Trainer(max_steps=2, batch_size=batch, precision="bf16-mixed", enable_progress_bar=False,
                         enable_checkpointing=False, logger=False)
    trainer.fit(MLP(features, width, depth), (x, y))
    train_step = trainer.engine._step
    single = jax.jit(train_step, donate_argnums=0)
    live = list(train_step.read_state())

    def ktrainer_calls(count: int, wait: bool = False, state_io: bool = False) -> None:
        for index in range(count):
            live[0], live[1], vector = single(live[0], live[1], placed, np.int32(index))
            if wait:
                np.asarray(vector)
            if state_io:
                train_step.write_small(live[1])
                train_step.read_state()
        jax.block_until_ready(live[0])

    results["ktrainer step, back to back"] = steps_per_second(ktrainer_calls, steps)
    results["ktrainer step, each output read"] = steps_per_second(lambda n: ktrainer_calls(n, True), steps)
    results["ktrainer step, read + state written back"] = steps_per_second(lambda n: ktrainer_calls(n, True, True),
                                                                           steps)
    train_step.big = live[0]

    sizes = argparse.Namespace(features=features, width=width, depth=depth, batch=batch, epochs=4)
    with tempfile.TemporaryDirectory() as root:
        for name, monitored in (("Trainer, steps_per_execution 1", False),
                                ("Trainer + ThroughputMonitor + CSVLogger", True)):
            results[name] = trainer_rate((x, y), sizes, "bf16-mixed", 1, f"{root}/{monitored}", monitored)[0]
    for name, rate in results.items():
        print(f"{name:42s} {rate:9.1f} steps/s", flush=True)


if __name__ == "__main__":
    main()
