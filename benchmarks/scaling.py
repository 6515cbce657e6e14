"""Steps/s and samples/s of the same module on 1, 2 and 4 devices (GPUs where present, else logical CPUs).

    python benchmarks/scaling.py [--steps 200] [--batch-size 64]

Each device count runs in its own process (a TensorFlow process has one device layout). On
logical CPU devices all replicas share the same cores, so this shows only the overhead of
replication (expect samples/s flat or falling); on GPUs it shows the real scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

CHILD = "--child"


def child(devices: int, steps: int, batch_size: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import ktrainer as kt

    class Mlp(kt.Module):
        def build(self):
            return keras.Sequential([keras.layers.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                                     keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])

        def configure_optimizers(self):
            return keras.optimizers.Adam(1e-3)

        def training_step(self, batch):
            x, y = batch
            logits = self.model(x, training=True)
            return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    class Timer(kt.callbacks.Callback):
        def __init__(self):
            self.times = []

        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            self.times.append((trainer.global_step, time.perf_counter()))

    trainer = kt.Trainer(devices=devices, batch_size=batch_size, max_steps=steps, steps_per_execution=10,
                         logger=False, enable_progress_bar=False, callbacks=[timer := Timer()])
    rng = np.random.default_rng(0)
    n = batch_size * devices * steps
    x = rng.normal(size=(n, 256)).astype("float32")
    trainer.fit(Mlp(), train_data=(x, rng.integers(0, 10, n).astype("int32")))
    (first_step, start), (last_step, end) = timer.times[1], timer.times[-1]  # the first call includes tracing
    rate = (last_step - first_step) / (end - start)
    print(json.dumps({"devices": devices, "accelerator": trainer.plan.accelerator, "steps_per_sec": rate,
                      "samples_per_sec": rate * trainer.global_batch_size}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="per device")
    parser.add_argument(CHILD, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.batch_size)
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}; "
          f"batch {args.batch_size} per device, {args.steps} steps")
    print(f"{'devices':>7} {'kind':>5} {'steps/s':>9} {'samples/s':>10} {'samples/s vs 1':>15}")
    base = None
    for devices in (1, 2, 4):
        done = subprocess.run([sys.executable, __file__, CHILD, str(devices), "--steps", str(args.steps),
                               "--batch-size", str(args.batch_size)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{devices:>7} failed: {done.stderr.strip().splitlines()[-1]}")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        base = base or result["samples_per_sec"]
        print(f"{devices:>7} {result['accelerator']:>5} {result['steps_per_sec']:>9.1f} "
              f"{result['samples_per_sec']:>10.0f} {result['samples_per_sec'] / base:>15.2f}")
    print("On logical CPUs the replicas share the same cores: this measures replication overhead, not speedup.")


if __name__ == "__main__":
    main()
