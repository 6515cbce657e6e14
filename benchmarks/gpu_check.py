"""The JAX engine on a GPU, in one process: precisions, Trainer vs Keras fit, MFU, a 1 GB checkpoint, exact resume.

    KERAS_BACKEND=jax python benchmarks/gpu_check.py [--tiny]

A compute-bound MLP (width 4096, batch 256; `--tiny`: width 64, batch 16, for a CPU run of the script).
Prints one line per measurement and a JSON summary last. No TensorFlow is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import ktrainer as kt  # noqa: E402


def make_model(width: int, depth: int) -> keras.Model:
    layers = [keras.layers.Input((width,))]
    layers += [keras.layers.Dense(width, activation="gelu") for _ in range(depth)]
    return keras.Sequential([*layers, keras.layers.Dense(16, dtype="float32")])


class MLP(kt.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.width, self.depth = width, depth

    def build(self):
        return make_model(self.width, self.depth)

    def configure_optimizers(self):
        return keras.optimizers.Adam(1e-4)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


class Clock(kt.callbacks.Callback):
    """Seconds per execution after the first epoch (compilation), and the MFU the ThroughputMonitor logged."""

    def __init__(self):
        self.epoch_times, self._start = [], 0.0

    def on_train_epoch_start(self, trainer, module):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.epoch_times.append(time.perf_counter() - self._start)


def trainer_rate(data, args, precision: str, root: str) -> tuple[float, float | None]:
    clock = Clock()
    monitor = kt.callbacks.ThroughputMonitor()
    trainer = kt.Trainer(max_epochs=args.epochs, batch_size=args.batch, precision=precision, seed=0,
                         steps_per_execution=args.spe, enable_progress_bar=False, enable_checkpointing=False,
                         logger=kt.loggers.CSVLogger(root), callbacks=[clock, monitor], default_root_dir=root)
    trainer.fit(MLP(args.width, args.depth), data)
    steps = len(data[0]) // args.batch
    return steps / statistics.median(clock.epoch_times[1:]), trainer.callback_metrics.get("perf/mfu_epoch")


def fit_rate(data, args, policy: str) -> float:
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = make_model(args.width, args.depth)
    keras.config.set_dtype_policy("float32")
    model.compile(keras.optimizers.Adam(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=args.spe)
    times = []

    class Times(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    model.fit(*data, batch_size=args.batch, epochs=args.epochs, verbose=0, callbacks=[Times()], shuffle=True)
    return len(data[0]) // args.batch / statistics.median(times[1:])


class TimedCheckpoint(kt.callbacks.ModelCheckpoint):
    """A ModelCheckpoint that times how long each save blocks the loop, and the wait for the background write."""

    blocking = waiting = 0.0

    def save(self, trainer, reason="manual"):
        start = time.perf_counter()
        super().save(trainer, reason)
        self.blocking += time.perf_counter() - start

    def wait(self):
        start = time.perf_counter()
        super().wait()
        self.waiting += time.perf_counter() - start


def checkpoint_check(args, root: str) -> dict:
    """Save a state of about `--checkpoint-gb` GB locally (async: the blocking part), then restore it."""
    width = int((args.checkpoint_gb * 2**30 / 4 / 3) ** 0.5)  # kernel + two Adam slots, float32
    module = MLP(width, 1)
    x = np.random.default_rng(0).normal(size=(args.batch, width)).astype("float32")
    y = np.zeros((args.batch,), "int32")
    saver = TimedCheckpoint(async_save=True)
    trainer = kt.Trainer(max_steps=1, batch_size=args.batch, default_root_dir=root, logger=False,
                         enable_progress_bar=False, callbacks=[saver])
    trainer.fit(module, (x, y))
    blocking, total = saver.blocking, saver.blocking + saver.waiting
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)
    resumed = kt.Trainer(max_steps=1, batch_size=args.batch, default_root_dir=root, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False)
    start = time.perf_counter()
    other = MLP(width, 1)
    with warnings.catch_warnings():  # this run saves nothing, so the saver's state is ignored: expected here
        warnings.filterwarnings("ignore", message="Resuming: the checkpoint has state for callbacks")
        resumed.fit(other, (x, y), ckpt_path="last")
    restore = time.perf_counter() - start
    same = all(np.array_equal(a, b) for a, b in zip(module.model.get_weights(), other.model.get_weights(),
                                                    strict=True))
    return {"checkpoint_bytes": size, "async_save_blocking_s": blocking, "save_total_s": total,
            "restore_and_fit_s": restore, "restored_weights_equal": same}


def resume_check(data, args, root: str) -> float:
    """Exact resume on this device (32-true): max |difference| of weights, straight run vs two legs."""
    def run(where, max_steps, ckpt=None):
        trainer = kt.Trainer(max_steps=max_steps, batch_size=args.batch, seed=0, default_root_dir=where,
                             logger=False, enable_progress_bar=False)
        module = MLP(args.width, 2)
        trainer.fit(module, data, ckpt_path=ckpt)
        return module.model.get_weights()

    straight = run(f"{root}/straight", 12)
    run(f"{root}/legs", 5)
    resumed = run(f"{root}/legs", 12, "last")
    return max(float(np.max(np.abs(a - b))) for a, b in zip(straight, resumed, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small sizes, for a CPU run of the script")
    args = parser.parse_args()
    if args.tiny:
        args.width, args.depth, args.batch, args.examples, args.epochs, args.spe, args.checkpoint_gb = (
            64, 2, 16, 256, 3, 4, 0.01)
    else:
        args.width, args.depth, args.batch, args.examples, args.epochs, args.spe, args.checkpoint_gb = (
            4096, 4, 256, 256 * 64, 4, 16, 1.0)
    device = jax.devices()[0]
    print(f"machine: {platform.machine()}, {device.platform} {device.device_kind} x {jax.device_count()}, "
          f"python {platform.python_version()}, jax {jax.__version__}, keras {keras.__version__}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.examples, args.width)).astype("float32")
    data = (x, (x[:, :16].argmax(axis=1)).astype("int32"))
    root = tempfile.mkdtemp(prefix="ktrainer-gpu-check-")
    summary: dict = {"width": args.width, "depth": args.depth, "batch": args.batch, "steps_per_execution": args.spe}
    try:
        for precision in ("32-true", "16-mixed", "bf16-mixed"):
            rate, mfu = trainer_rate(data, args, precision, f"{root}/{precision}")
            summary[f"trainer_{precision}_steps_per_s"], summary[f"mfu_{precision}"] = rate, mfu
            print(f"Trainer {precision}: {rate:.1f} steps/s, MFU {mfu}", flush=True)
        summary["bf16_over_32"] = summary["trainer_bf16-mixed_steps_per_s"] / summary["trainer_32-true_steps_per_s"]
        for precision, policy in (("32-true", "float32"), ("bf16-mixed", "mixed_bfloat16")):
            rate = fit_rate(data, args, policy)
            summary[f"fit_{precision}_steps_per_s"] = rate
            summary[f"trainer_over_fit_{precision}"] = summary[f"trainer_{precision}_steps_per_s"] / rate
            print(f"Keras fit {policy}: {rate:.1f} steps/s; Trainer/fit "
                  f"{summary[f'trainer_over_fit_{precision}']:.2f}", flush=True)
        summary.update(checkpoint_check(args, f"{root}/checkpoint"))
        print(f"checkpoint: {summary['checkpoint_bytes'] / 2**30:.2f} GiB, async save blocked "
              f"{summary['async_save_blocking_s']:.2f} s of {summary['save_total_s']:.2f} s", flush=True)
        summary["resume_max_difference"] = resume_check(data, args, f"{root}/resume")
        print(f"exact resume (32-true): max |difference| {summary['resume_max_difference']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(summary))
    sys.exit(0 if summary["resume_max_difference"] == 0.0 and summary["restored_weights_equal"] else 1)


if __name__ == "__main__":
    main()
