"""Checkpoint save/restore throughput against a plain fsspec write/read, async blocking time, peak memory.

    python benchmarks/checkpoint_io.py [--megabytes 100] [--repeats 3]

A model whose weights plus Adam slots hold about `--megabytes` of state is saved and restored
through ktrainer's checkpoint manager (npz streamed and hashed, manifest last, read back and
verified), and the same number of bytes is written and read with one plain fsspec call, on a
local folder and on S3 (a moto server process on 127.0.0.1), in one run. Then a Trainer saves the state with
`ModelCheckpoint(async_save=False)` and `(async_save=True)`: the time the training loop is
blocked by each. Peak extra memory of a whole save (taking the state and writing it) is measured
with tracemalloc (numpy reports its buffers to it): a synchronous save streams the live
variables one at a time, an async one first copies them all to host memory.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ktrainer as kt  # noqa: E402
from ktrainer.checkpoint.manager import CheckpointManager  # noqa: E402
from ktrainer.checkpoint.state import TrainingState, capture, restore  # noqa: E402
from ktrainer.fs import Location  # noqa: E402


class Big(kt.Module):
    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def build(self):
        return keras.Sequential([keras.layers.Input((self.width,))] +
                                [keras.layers.Dense(self.width) for _ in range(4)])

    def configure_optimizers(self):
        return keras.optimizers.Adam(1e-4)

    def training_step(self, batch):
        return keras.ops.mean(keras.ops.square(self.model(batch[0]) - batch[1]))


def width_for(megabytes: float) -> int:
    # 4 layers of width^2 float32 weights, times 3 with Adam's two slots.
    return int((megabytes * 1e6 / (3 * 4 * 4)) ** 0.5)


def timed(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def io_rates(location: Location, state: TrainingState, model, optimizer, repeats: int) -> dict[str, float]:
    manager = CheckpointManager(location)
    megabytes = state.nbytes / 1e6
    blob = np.random.default_rng(0).bytes(state.nbytes)
    fs, root = location.fs, location.path.rstrip("/")
    fs.makedirs(root, exist_ok=True)
    counter = iter(range(10**6))

    def save():
        manager.save(f"step-{next(counter):08d}", state.to_files(), {"step": 0})

    def restore_all():
        loaded = TrainingState.from_files(manager.read("step-00000000")[1])
        restore(loaded, model, optimizer)

    results = {
        "save MB/s": megabytes / timed(save, repeats),
        "plain write MB/s": megabytes / timed(lambda: fs.pipe_file(f"{root}/plain.bin", blob), repeats),
        "restore MB/s": megabytes / timed(restore_all, repeats),
        "plain read MB/s": megabytes / timed(lambda: fs.cat_file(f"{root}/plain.bin"), repeats),
    }
    tracemalloc.start()
    for copy in (False, True):  # a synchronous save streams the live variables; an async one copies first
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        taken = capture(model, optimizer, {"progress": {}}, copy=copy)
        manager.save(f"step-{next(counter):08d}", taken.to_files(), {"step": 0})
        del taken
        label = "async" if copy else "sync"
        results[f"{label} save peak extra / state"] = (tracemalloc.get_traced_memory()[1] - base) / state.nbytes
    tracemalloc.stop()
    return results


class SaveTimer(kt.callbacks.ModelCheckpoint):
    """Times how long each save blocks the training loop."""

    def __init__(self, **kwargs):
        super().__init__(every_n_train_steps=1, save_last=False, max_to_keep=2, **kwargs)
        self.blocked: list[float] = []

    def save(self, trainer):
        self.wait()  # as if training took longer than a save: measure only what this save itself blocks
        start = time.perf_counter()
        super().save(trainer)
        self.blocked.append(time.perf_counter() - start)


def blocking(root: str, width: int, steps: int, options: dict) -> dict[str, float]:
    found = {}
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * steps, width)).astype("float32")
    for async_save in (False, True):
        timer = SaveTimer(async_save=async_save, dirpath=f"{root}/async-{async_save}", storage_options=options)
        trainer = kt.Trainer(max_steps=steps, batch_size=8, callbacks=[timer], logger=False,
                             enable_progress_bar=False)
        trainer.fit(Big(width), train_data=(x, x))
        found[async_save] = statistics.median(timer.blocked[1:])  # the first save waits for nothing before it
    return {"sync save blocks s": found[False], "async save blocks s": found[True],
            "async / sync blocking": found[True] / found[False]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="steps (one save each) for the blocking measure")
    args = parser.parse_args()
    width = width_for(args.megabytes)
    module = Big(width)
    model = module.build()
    optimizer = module.configure_optimizers()
    optimizer.build(model.trainable_variables)
    state = capture(model, optimizer, {"progress": {}})
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}; "
          f"state {state.nbytes / 1e6:.0f} MB (4 Dense {width}x{width} + Adam slots)")

    for name, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(name, value)
    # The S3 server runs in its own process, so that neither its memory nor its CPU time counts as ours.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s3_options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    try:
        with tempfile.TemporaryDirectory() as folder:
            Location("s3://bench", s3_options).fs.mkdir("bench")
            for label, location in (("local", Location(f"{folder}/ckpt")), ("s3 (moto)", Location("s3://bench/ckpt",
                                                                                                   s3_options))):
                rates = io_rates(location, state, model, optimizer, args.repeats)
                print(f"{label:>10}: save {rates['save MB/s']:.0f} MB/s vs plain write {rates['plain write MB/s']:.0f}"
                      f" ({rates['save MB/s'] / rates['plain write MB/s']:.2f}x); restore {rates['restore MB/s']:.0f}"
                      f" MB/s vs plain read {rates['plain read MB/s']:.0f} "
                      f"({rates['restore MB/s'] / rates['plain read MB/s']:.2f}x); "
                      f"peak extra memory of a save: {rates['sync save peak extra / state']:.2f}x the state "
                      f"(sync), {rates['async save peak extra / state']:.2f}x (async)")
            for label, root, options in (("local", f"{folder}/blocking", {}),
                                         ("s3 (moto)", "s3://bench/blocking", s3_options)):
                found = blocking(root, width, args.steps, options)
                print(f"{label:>10}: a save blocks the loop {found['sync save blocks s']:.3f} s synchronous, "
                      f"{found['async save blocks s']:.3f} s async ({found['async / sync blocking']:.1%})")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
