"""The JAX engine on a GPU, in one process: precisions, Trainer vs Keras fit, MFU, a 1 GB checkpoint, exact resume.

    KERAS_BACKEND=jax python benchmarks/gpu_check.py [--tiny] [--budget SECONDS]

Against Keras `fit`, for 32-true and bf16-mixed at 1 and 16 (`--tiny`: 4) steps per call: the Trainer with
`max_in_flight=1` and with its default window against `fit` with no callbacks; and a real run's callbacks,
`fit` with `keras.callbacks.ModelCheckpoint(save_freq=64)` and `keras.callbacks.TensorBoard(update_freq=1)`
against the Trainer with a `ModelCheckpoint(every_n_train_steps=64)` and its TensorBoard logger every step
(`--tiny`: every 8 steps).
Without TensorFlow (Keras's TensorBoard callback writes through `tf.summary`), `fit`'s TensorBoard is a Keras
callback that reads every step's logs in `on_train_batch_end` and writes them with ktrainer's event writer.

A compute-bound MLP: 256 input features, 4 gelu layers of width 8192, batch 1024, Adam. A step is about
1.25 TFLOP against 1 MB of input, so the matrix products set the pace, not the host feeding the batches.
Also a 1-device `strategy="fsdp"` smoke run against the one-device Trainer (the same losses, the same speed).
`--tiny` (width 64, batch 16) runs the script on a CPU. Each measurement runs on its own: one that fails
prints its traceback and the others still report. Prints one line per measurement and a JSON summary
last; exits 1 when a measurement failed, resume was not exact or fsdp's losses differ by more than 1e-5.
No TensorFlow is needed.
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
import traceback
import warnings
from collections.abc import Callable

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import ktrainer as kt  # noqa: E402


def make_model(features: int, width: int, depth: int) -> keras.Model:
    layers = [keras.layers.Input((features,))]
    layers += [keras.layers.Dense(width, activation="gelu") for _ in range(depth)]
    return keras.Sequential([*layers, keras.layers.Dense(16, dtype="float32")])


class MLP(kt.Module):
    def __init__(self, features: int, width: int, depth: int):
        super().__init__()
        self.features, self.width, self.depth = features, width, depth

    def build(self):
        return make_model(self.features, self.width, self.depth)

    def configure_optimizers(self):
        return keras.optimizers.Adam(1e-4)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


class Clock(kt.callbacks.Callback):
    """Seconds of each training epoch (the first holds the compilation)."""

    def __init__(self):
        self.epoch_times, self._start = [], 0.0

    def on_train_epoch_start(self, trainer, module):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.epoch_times.append(time.perf_counter() - self._start)


def steps_per_epoch(data: tuple, args: argparse.Namespace) -> int:
    """Batches in one epoch of `data`."""
    return len(data[0]) // args.batch


def trainer_rate(data, args, precision: str, spe: int, root: str, monitored: bool = True,
                 max_in_flight: int = 2, like_a_run: bool = False) -> tuple[float, float | None]:
    """Trainer steps/s (median over the epochs after the first) and the epoch's MFU it logged; `monitored`: with
    a ThroughputMonitor and a CSVLogger (else neither, and no MFU); `like_a_run`: instead, a checkpoint every
    `args.save_every` steps and TensorBoard logging every step."""
    clock = Clock()
    if like_a_run:
        logger, callbacks = kt.loggers.TensorBoardLogger(root), [clock, kt.callbacks.ModelCheckpoint(
            every_n_train_steps=args.save_every)]
    else:
        logger = kt.loggers.CSVLogger(root) if monitored else False
        callbacks = [clock, kt.callbacks.ThroughputMonitor()] if monitored else [clock]
    trainer = kt.Trainer(max_epochs=args.epochs, batch_size=args.batch, precision=precision, seed=0,
                         steps_per_execution=spe, max_in_flight=max_in_flight, enable_progress_bar=False,
                         enable_checkpointing=like_a_run, logger=logger, callbacks=callbacks,
                         log_every_n_steps=1 if like_a_run else 50, default_root_dir=root)
    trainer.fit(MLP(args.features, args.width, args.depth), data)
    mfu = trainer.callback_metrics.get("perf/mfu_epoch")
    return steps_per_epoch(data, args) / statistics.median(clock.epoch_times[1:]), None if mfu is None else float(mfu)


class StepEvents(keras.callbacks.Callback):
    """What `keras.callbacks.TensorBoard(update_freq=1)` does each step where TensorFlow is missing: read the
    step's logs on the host in `on_train_batch_end` and write them to an event file."""

    def __init__(self, directory: str):
        super().__init__()
        from ktrainer.loggers.event_file import EventFile

        self.events, self.step = EventFile(directory), 0

    def on_train_batch_end(self, batch, logs=None):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        self.step += 1
        for name, value in (logs or {}).items():
            self.events.add_event(Event(wall_time=time.time(), step=self.step,
                                        summary=scalar_pb(f"batch_{name}", float(value))))

    def on_train_end(self, logs=None):
        self.events.close()


def run_callbacks(root: str, save_every: int) -> list[keras.callbacks.Callback]:
    """A real run's callbacks for `fit`: a checkpoint every `save_every` steps, TensorBoard every step."""
    try:
        import tensorflow  # noqa: F401 - Keras's TensorBoard callback needs it

        board = keras.callbacks.TensorBoard(f"{root}/tensorboard", update_freq=1)
    except ImportError:
        board = StepEvents(f"{root}/tensorboard")
    return [keras.callbacks.ModelCheckpoint(f"{root}/model.keras", save_freq=save_every), board]


def fit_rate(data, args, policy: str, spe: int, callbacks: list | None = None) -> float:
    """Keras `model.fit` steps/s on the same model, data and batch (median over the epochs after the first),
    with `callbacks` or none."""
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = make_model(args.features, args.width, args.depth)
    keras.config.set_dtype_policy("float32")
    model.compile(keras.optimizers.Adam(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=spe)
    times = []

    class Times(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    model.fit(*data, batch_size=args.batch, epochs=args.epochs, verbose=0, callbacks=[Times(), *(callbacks or [])],
              shuffle=True)
    return steps_per_epoch(data, args) / statistics.median(times[1:])


class TimedCheckpoint(kt.callbacks.ModelCheckpoint):
    """A ModelCheckpoint that times how long its saves block the loop (taking the snapshot), apart from the
    waits for a background write (a save waits for the previous one; the fit's end waits for the last)."""

    blocking = waiting = 0.0

    def save(self, trainer, reason="manual"):
        start, waited = time.perf_counter(), self.waiting
        super().save(trainer, reason)
        self.blocking += time.perf_counter() - start - (self.waiting - waited)

    def wait(self):
        start = time.perf_counter()
        super().wait()
        self.waiting += time.perf_counter() - start


def checkpoint_check(args, root: str) -> dict:
    """Save a state of about `checkpoint_gb` GB locally with `async_save` (what blocks the loop, and the whole save
    to its commit), then restore it into a new model."""
    width = int((args.checkpoint_gb * 2**30 / 4 / 3) ** 0.5) // 8 * 8  # kernel + two Adam slots, float32
    module = MLP(width, width, 1)
    x = np.random.default_rng(0).normal(size=(args.batch, width)).astype("float32")
    y = np.zeros((args.batch,), "int32")
    saver = TimedCheckpoint(async_save=True)
    trainer = kt.Trainer(max_steps=1, batch_size=args.batch, default_root_dir=root, logger=False,
                         enable_progress_bar=False, callbacks=[saver])
    trainer.fit(module, (x, y))
    blocking, total = saver.blocking, saver.blocking + saver.waiting
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)
    # The checkpoint is at step 1, so this run restores and trains nothing: the time is the restore's.
    resumed = kt.Trainer(max_steps=1, batch_size=args.batch, default_root_dir=root, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False)
    start = time.perf_counter()
    other = MLP(width, width, 1)
    with warnings.catch_warnings():  # this run saves nothing, so the saver's state is ignored: expected here
        warnings.filterwarnings("ignore", message="Resuming: the checkpoint has state for callbacks")
        resumed.fit(other, (x, y), ckpt_path="last")
    restore = time.perf_counter() - start
    same = all(np.array_equal(a, b) for a, b in zip(module.model.get_weights(), other.model.get_weights(),
                                                    strict=True))
    return {"checkpoint_bytes": size, "async_save_blocking_s": blocking, "save_total_s": total,
            "restore_s": restore, "restored_weights_equal": same}


def resume_check(data, args, root: str) -> dict:
    """Exact resume on this device (32-true), max |difference| of the weights against a straight 12-step run:
    - a second straight run (is the device deterministic for this step?);
    - a run stopped at step 5 and resumed;
    - a resume from an async save at step 5 of a run that went on to step 12 (the snapshot must not see
      the donated updates of steps 6-12)."""

    def run(where, max_steps, ckpt=None, callbacks=()):
        trainer = kt.Trainer(max_steps=max_steps, batch_size=args.batch, seed=0, default_root_dir=where,
                             logger=False, enable_progress_bar=False, callbacks=list(callbacks))
        module = MLP(args.features, args.resume_width, 2)
        trainer.fit(module, data, ckpt_path=ckpt)
        return module.model.get_weights()

    def difference(a, b):
        return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))

    straight = run(f"{root}/straight", 12)
    again = run(f"{root}/again", 12)
    run(f"{root}/legs", 5)
    resumed = run(f"{root}/legs", 12, "last")
    run(f"{root}/async", 12, callbacks=[kt.callbacks.ModelCheckpoint(every_n_train_steps=5, async_save=True)])
    from_async = run(f"{root}/async-resumed", 12, f"{root}/async/checkpoints/step-00000005")
    return {"straight_runs_max_difference": difference(straight, again),
            "resume_max_difference": difference(straight, resumed),
            "async_snapshot_resume_max_difference": difference(straight, from_async)}


def fsdp_check(data, args, root: str) -> dict:
    """strategy="fsdp" on this one device against the one-device Trainer (32-true, one epoch each, the same seed):
    the sharded path (mesh, checked layouts, the step's pinned output layouts) must train the same losses at
    the same speed; with one device it splits nothing, so any difference is the path's own cost."""

    class Losses(kt.callbacks.Callback):
        def __init__(self):
            self.losses, self.start, self.seconds = [], 0.0, 0.0

        def on_train_epoch_start(self, trainer, module):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch_idx):
            self.losses.append(float(outputs["train/loss_step"]))

        def on_train_epoch_end(self, trainer, module):
            self.seconds = time.perf_counter() - self.start

    def run(where: str, **strategy) -> Losses:
        losses = Losses()
        trainer = kt.Trainer(max_epochs=2, batch_size=args.batch, seed=0, default_root_dir=where, logger=False,
                             enable_progress_bar=False, enable_checkpointing=False, callbacks=[losses],
                             log_every_n_steps=1, **strategy)
        trainer.fit(MLP(args.features, args.width, args.depth), data, shuffle=False)
        return losses

    plain, fsdp = run(f"{root}/one-device"), run(f"{root}/fsdp", strategy="fsdp", devices=1, fsdp_min_bytes=0)
    return {"fsdp_max_loss_difference": max(abs(a - b) for a, b in zip(plain.losses, fsdp.losses, strict=True)),
            "fsdp_over_one_device": plain.seconds / fsdp.seconds}


SIZES = {  # features, width, depth, batch, steps per epoch, epochs, steps_per_execution, checkpoint GB, resume width,
    # steps between checkpoints in the runs with a real run's callbacks
    "full": (256, 8192, 4, 1024, 64, 6, 16, 1.0, 4096, 64),
    "tiny": (32, 64, 2, 16, 16, 3, 4, 0.01, 64, 8),
}


class Sections:
    """Runs each measurement on its own, so that one failure still leaves the others' figures."""

    def __init__(self, budget_s: float):
        self.errors: list[str] = []
        self.deadline = time.perf_counter() + budget_s

    def run(self, name: str, measure: Callable[[], None], optional: bool = False) -> None:
        """Run `measure`, printing its traceback if it fails; an optional one is skipped past the time budget."""
        if optional and time.perf_counter() > self.deadline:
            print(f"{name}: skipped, past the time budget", flush=True)
            return
        start = time.perf_counter()
        try:
            measure()
        except Exception:  # report it and go on to the next measurement
            traceback.print_exc()
            self.errors.append(name)
        print(f"[{name}: {time.perf_counter() - start:.1f} s]", flush=True)


def main() -> None:  # noqa: C901 - the sections are closures over one summary; each is short
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small sizes, for a CPU run of the script")
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds after which the optional measurements are skipped (default 300)")
    args = parser.parse_args()
    (args.features, args.width, args.depth, args.batch, steps, args.epochs, args.spe, args.checkpoint_gb,
     args.resume_width, args.save_every) = SIZES["tiny" if args.tiny else "full"]
    device = jax.devices()[0]
    print(f"machine: {platform.machine()}, {device.platform} {device.device_kind} x {jax.device_count()}, "
          f"python {platform.python_version()}, jax {jax.__version__}, keras {keras.__version__}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * args.batch, args.features)).astype("float32")
    data = (x, (x[:, :16].argmax(axis=1)).astype("int32"))
    root = tempfile.mkdtemp(prefix="ktrainer-gpu-check-")
    summary: dict = {"features": args.features, "width": args.width, "depth": args.depth, "batch": args.batch,
                     "steps_per_epoch": steps, "epochs": args.epochs, "steps_per_execution": args.spe}
    sections = Sections(args.budget)

    def precision_rate(precision: str, spe: int) -> None:
        rate, mfu = trainer_rate(data, args, precision, spe, f"{root}/{precision}-{spe}")
        summary[f"trainer_{precision}_spe{spe}_steps_per_s"], summary[f"mfu_{precision}_spe{spe}"] = rate, mfu
        print(f"Trainer {precision}, steps_per_execution {spe}: {rate:.1f} steps/s, MFU {mfu}", flush=True)

    def window_1_rate(precision: str, spe: int) -> None:
        rate = trainer_rate(data, args, precision, spe, f"{root}/{precision}-{spe}-window-1", max_in_flight=1)[0]
        summary[f"trainer_window1_{precision}_spe{spe}_steps_per_s"] = rate
        print(f"Trainer {precision}, steps_per_execution {spe}, max_in_flight=1: {rate:.1f} steps/s", flush=True)

    def against_fit(precision: str, policy: str, spe: int) -> None:
        rate = fit_rate(data, args, policy, spe)
        summary[f"fit_{precision}_spe{spe}_steps_per_s"] = rate
        ratios = {window: summary[f"trainer{key}_{precision}_spe{spe}_steps_per_s"] / rate
                  for window, key in (("default", ""), ("1", "_window1"))
                  if f"trainer{key}_{precision}_spe{spe}_steps_per_s" in summary}
        for window, ratio in ratios.items():
            summary[f"trainer_over_fit_{precision}_spe{spe}" + ("" if window == "default" else "_window1")] = ratio
        print(f"Keras fit {policy}, steps_per_execution {spe}, no callbacks: {rate:.1f} steps/s; Trainer/fit "
              + ", ".join(f"{ratio:.2f} (window {window})" for window, ratio in ratios.items()), flush=True)

    def like_a_run(precision: str, policy: str, spe: int) -> None:
        where = f"{root}/{precision}-{spe}-like-a-run"
        ours = trainer_rate(data, args, precision, spe, f"{where}/trainer", like_a_run=True)[0]
        theirs = fit_rate(data, args, policy, spe, callbacks=run_callbacks(f"{where}/fit", args.save_every))
        shutil.rmtree(where, ignore_errors=True)  # the checkpoints of a big model fill the disk
        summary[f"trainer_run_{precision}_spe{spe}_steps_per_s"] = ours
        summary[f"fit_run_{precision}_spe{spe}_steps_per_s"] = theirs
        summary[f"trainer_over_fit_run_{precision}_spe{spe}"] = ours / theirs
        print(f"with a checkpoint every {args.save_every} steps and TensorBoard every step, {precision}, "
              f"steps_per_execution {spe}: Trainer {ours:.1f} steps/s, Keras fit {theirs:.1f}; Trainer/fit "
              f"{ours / theirs:.2f}", flush=True)

    def resume() -> None:
        summary.update(resume_check(data, args, f"{root}/resume"))
        print(f"exact resume (32-true): max |difference| {summary['resume_max_difference']}, from a mid-run async "
              f"save {summary['async_snapshot_resume_max_difference']} (two straight runs: "
              f"{summary['straight_runs_max_difference']})", flush=True)

    def checkpoint() -> None:
        summary.update(checkpoint_check(args, f"{root}/checkpoint"))
        print(f"checkpoint: {summary['checkpoint_bytes'] / 2**30:.2f} GiB, async save blocked "
              f"{summary['async_save_blocking_s']:.2f} s of {summary['save_total_s']:.2f} s; restore (a new model, "
              f"built and loaded) {summary['restore_s']:.2f} s; weights equal {summary['restored_weights_equal']}",
              flush=True)

    def fsdp() -> None:
        summary.update(fsdp_check(data, args, f"{root}/fsdp"))
        print(f"strategy='fsdp' on 1 device: max |loss difference| {summary['fsdp_max_loss_difference']} against "
              f"one device, speed {summary['fsdp_over_one_device']:.2f}x of it (second epoch)", flush=True)

    against = (("32-true", "float32"), ("bf16-mixed", "mixed_bfloat16"))
    try:
        spe = args.spe
        for precision in ("32-true", "16-mixed", "bf16-mixed"):
            sections.run(f"Trainer {precision}", lambda p=precision: precision_rate(p, spe))
        if f"trainer_bf16-mixed_spe{spe}_steps_per_s" in summary and f"trainer_32-true_spe{spe}_steps_per_s" in summary:
            summary["bf16_over_32"] = (summary[f"trainer_bf16-mixed_spe{spe}_steps_per_s"]
                                       / summary[f"trainer_32-true_spe{spe}_steps_per_s"])
            print(f"bf16-mixed / 32-true: {summary['bf16_over_32']:.2f}", flush=True)
        for precision, policy in against:
            sections.run(f"Trainer {precision}, max_in_flight=1", lambda p=precision: window_1_rate(p, spe))
            sections.run(f"Keras fit {policy}", lambda p=precision, q=policy: against_fit(p, q, spe))
        sections.run("exact resume", resume)
        sections.run("checkpoint", checkpoint)
        sections.run("fsdp on one device", fsdp)
        for precision, policy in against:
            sections.run(f"like a run, {precision}", lambda p=precision, q=policy: like_a_run(p, q, spe),
                         optional=True)
        for precision, policy in reversed(against):  # bf16 first: the pair the goals name
            sections.run(f"Trainer {precision}, steps_per_execution 1", lambda p=precision: precision_rate(p, 1),
                         optional=True)
            sections.run(f"Trainer {precision}, steps_per_execution 1, max_in_flight=1",
                         lambda p=precision: window_1_rate(p, 1), optional=True)
            sections.run(f"Keras fit {policy}, steps_per_execution 1",
                         lambda p=precision, q=policy: against_fit(p, q, 1), optional=True)
            sections.run(f"like a run, {precision}, steps_per_execution 1",
                         lambda p=precision, q=policy: like_a_run(p, q, 1), optional=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary["errors"] = sections.errors
    print(json.dumps(summary))
    exact = (summary.get("resume_max_difference") == 0.0 and summary.get("async_snapshot_resume_max_difference") == 0.0
             and summary.get("restored_weights_equal") is True and summary.get("fsdp_max_loss_difference", 1.0) <= 1e-5)
    sys.exit(0 if exact and not sections.errors else 1)


if __name__ == "__main__":
    main()
