"""What checkpoints cost the user, through the public API, against plain fsspec I/O of the same files, in one process.

    python benchmarks/checkpoint_io.py [--megabytes 100] [--saves 6] [--storage local s3]

For a model whose weights plus Adam slots hold about `--megabytes` of state, on a local folder
and on S3 (a moto server in its own process on 127.0.0.1):

- save: how long one save blocks the training loop (a Trainer with `ModelCheckpoint`, synchronous
  and `async_save=True`; median over `--saves` saves, each started once the previous one was
  committed), against a plain fsspec write of the very same files (their bytes already in memory)
  to fresh paths; and, for async, against one in-memory copy of the state (what it must wait for);
- resume: what `fit(ckpt_path=...)` adds before training starts (find, read, verify every
  checksum, load; median of 3 resumes, as of 3 plain reads), against a plain fsspec read of the
  same files, and what verification alone costs; then the same in fresh processes (3 of each),
  as a user's resume runs: in this process a read reuses memory the earlier ones freed;
- preemption: the time from SIGTERM to the committed checkpoint, and to the process's exit, for
  a training process of this model (and of the small demo model).

Figures are ratios against the plain I/O measured in the same run: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ktrainer as kt  # noqa: E402
from ktrainer.checkpoint import FsspecCheckpointIO  # noqa: E402
from ktrainer.checkpoint.checksum import Checksum  # noqa: E402
from ktrainer.utils.fs import Location  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class Big(kt.Module):
    """Four square Dense layers: 4 x width^2 float32 weights, x3 with Adam's two slots."""

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

    def train_data(self):
        x = np.random.default_rng(0).normal(size=(64, self.width)).astype("float32")
        return x, x


def width_for(megabytes: float) -> int:
    return int((megabytes * 1e6 / (3 * 4 * 4)) ** 0.5)


class TimedCheckpoint(kt.callbacks.ModelCheckpoint):
    """Times how long each save blocks the training loop and, after it, a plain write of the same files.

    Each save starts once the previous one is committed (as if training took longer than a save),
    so only what the save itself blocks is timed.
    """

    def __init__(self, options: dict, **kwargs):
        super().__init__(every_n_train_steps=1, save_last=False, max_to_keep=2, **kwargs)
        self.options = options
        self.blocked: list[float] = []
        self.plain: list[float] = []
        self.copies: list[float] = []

    def save(self, trainer, reason="manual"):
        self.wait()
        start = time.perf_counter()
        super().save(trainer, reason)
        self.blocked.append(time.perf_counter() - start)
        self.wait()
        _, files = self.io.read(self.last_saved.rsplit("/", 1)[1])
        self.plain.append(plain_io(Location(self.location.url, self.options), files)[0])
        state = trainer.state_dict()
        variables = [*state["model"].values(), *state["optimizer"].values()]
        start = time.perf_counter()
        copies = [np.array(variable, copy=True) for variable in variables]  # into fresh host memory
        self.copies.append(time.perf_counter() - start)
        del copies


class LoadTimer(kt.callbacks.Callback):
    """Times what `fit(ckpt_path=...)` does to resume: find and read the checkpoint (every checksum checked), then
    `trainer.load_state_dict(copy=False)` (checks, then assigns every variable and the progress), as fit does."""

    def __init__(self, ckpt_path: str, options: dict):
        self.ckpt_path, self.options, self.seconds = ckpt_path, options, None

    def on_fit_start(self, trainer, module):
        start = time.perf_counter()
        resumable = kt.checkpoint.find_checkpoint(self.ckpt_path, trainer.checkpoint_dir, self.options)
        trainer.load_state_dict(resumable.state, copy=False)  # as fit(ckpt_path=...) does
        self.seconds = time.perf_counter() - start


def plain_io(location: Location, files: dict[str, bytes]) -> tuple[float, float]:
    """Seconds to write the files with plain fsspec calls to fresh paths, then to read them back."""
    fs = location.fs
    folder = f"{location.path.rstrip('/')}/plain-{time.time_ns()}"
    fs.makedirs(folder, exist_ok=True)
    start = time.perf_counter()
    for name, data in files.items():
        fs.pipe_file(f"{folder}/{name}", data)
    written = time.perf_counter() - start
    start = time.perf_counter()
    for name in files:
        fs.cat_file(f"{folder}/{name}")
    return written, time.perf_counter() - start


def measure(url: str, options: dict, width: int, saves: int) -> dict[str, float]:
    found: dict[str, float] = {}
    trainer_args = {"batch_size": 8, "logger": False, "enable_progress_bar": False, "storage_options": options}
    configurations = [("sync", {}), ("async", {"async_save": True})]
    if Location(url, options).is_local:
        configurations.append(("sync, no fsync", {"fsync": False}))  # fsync only acts on a local disk
    for label, settings in configurations:
        folder = f"{url}/save-{label.replace(', ', '-').replace(' ', '')}"
        timer = TimedCheckpoint(options, dirpath=folder, **settings)
        trainer = kt.Trainer(max_steps=saves + 1, callbacks=[timer], **trainer_args)
        trainer.fit(Big(width))
        found[label] = statistics.median(timer.blocked[1:])
        found[f"plain write ({label})"] = statistics.median(timer.plain[1:])
        if label == "sync":
            found["copy"] = statistics.median(timer.copies[1:])
    io = FsspecCheckpointIO(Location(f"{url}/save-sync", options))
    newest = max(io.list(), key=lambda info: info.committed)
    reads, plain_reads, checks = [], [], []
    for _ in range(3):
        start = time.perf_counter()
        _, files = io.read(newest.name)
        reads.append(time.perf_counter() - start)
        start = time.perf_counter()
        for entry in newest.manifest.files:
            Checksum.of(files[entry.name], entry.algorithm)
        checks.append(time.perf_counter() - start)
        plain_reads.append(plain_io(Location(url, options), files)[1])
    found["read and verify"], found["verify only"] = statistics.median(reads), statistics.median(checks)
    found["plain read"] = statistics.median(plain_reads)
    found["bytes"] = sum(len(data) for data in files.values())
    resumes = []
    for _ in range(3):  # as many as the plain reads: the first of each in a process pays for fresh memory
        loader = LoadTimer(f"{url}/save-sync/{newest.name}", options)
        kt.Trainer(max_steps=newest.step + 1, callbacks=[loader], enable_checkpointing=False, **trainer_args).fit(
            Big(width))
        resumes.append(loader.seconds)
    found["resume adds"], found["first resume adds"] = statistics.median(resumes), resumes[0]
    checkpoint = f"{url}/save-sync/{newest.name}"
    found["fresh resume adds"] = statistics.median(in_a_fresh_process(RESUMED, checkpoint, options, width)
                                                   for _ in range(3))
    found["fresh plain read"] = statistics.median(in_a_fresh_process(READ, checkpoint, options, width)
                                                  for _ in range(3))
    return found


RESUMED = """
import sys
sys.path.insert(0, {here!r})
import ktrainer as kt
from checkpoint_io import Big, LoadTimer
loader = LoadTimer({checkpoint!r}, {options!r})
trainer = kt.Trainer(max_steps=1, callbacks=[loader], enable_checkpointing=False, logger=False,
                     enable_progress_bar=False, batch_size=8, storage_options={options!r})
trainer.fit(Big({width}))
print("seconds", loader.seconds)
"""

READ = """
import time
from ktrainer.utils.fs import Location
location = Location({checkpoint!r}, {options!r})
names = sorted(name for name in location.fs.ls(location.path, detail=False) if not name.endswith("manifest.json"))
start = time.perf_counter()
for name in names:
    location.fs.cat_file(name)
print("seconds", time.perf_counter() - start)
"""


def in_a_fresh_process(code: str, checkpoint: str, options: dict, width: int) -> float:
    """The seconds a new Python process reports for `code` (a resume, or a plain read): what a user's resume pays,
    with no memory freed earlier in the process to reuse."""
    source = code.format(here=HERE, checkpoint=checkpoint, options=options, width=width)
    result = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, check=True)
    return float(next(line for line in result.stdout.splitlines() if line.startswith("seconds")).split()[1])


PREEMPTED = """
import sys, time
sys.path.insert(0, {here!r})
from checkpoint_io import Big
import ktrainer as kt
from ktrainer.demos import DemoClassifier

class Report(kt.callbacks.Callback):
    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        if trainer.checkpoint_callback.last_saved:
            print("saved", trainer.checkpoint_callback.last_saved, flush=True)

module = Big({width}) if {width} else DemoClassifier()
trainer = kt.Trainer(max_steps=10**6, batch_size=8, logger=False, enable_progress_bar=False,
                     default_root_dir={root!r}, storage_options={options!r},
                     callbacks=[kt.callbacks.ModelCheckpoint(every_n_train_steps=3, max_to_keep=2), Report()])
trainer.fit(module)
"""


def preemption(url: str, options: dict, width: int) -> dict[str, float]:
    """Seconds from SIGTERM to the new manifest being committed, and to the process's exit."""
    root = f"{url}/preempted-{width}-{time.time_ns()}"
    code = PREEMPTED.format(here=HERE, width=width, root=root, options=options)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    for line in process.stdout:
        if line.startswith("saved"):
            break
    io = FsspecCheckpointIO(Location(f"{root}/checkpoints", options))
    before = max(info.committed for info in io.list() if info.manifest)
    sent = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    committed_at = None
    while process.poll() is None or committed_at is None:
        infos = [info for info in io.list() if info.manifest and info.committed > before]
        if infos and committed_at is None:
            committed_at = time.perf_counter()
        if process.poll() is not None and committed_at is None:
            infos = [info for info in io.list() if info.manifest and info.committed > before]
            committed_at = time.perf_counter() if infos else float("nan")
        time.sleep(0.005)  # a poll interval: the benchmark watches the storage for the commit
    exited = time.perf_counter()
    return {"to commit": committed_at - sent, "to exit": exited - sent, "status": process.returncode}


def start_s3() -> tuple[subprocess.Popen, dict]:
    for name, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(name, value)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # a poll interval while the server starts
    Location("s3://bench", options).fs.mkdir("bench")
    return server, options


def report(label: str, found: dict[str, float]) -> None:
    """Print one storage's figures, each against the plain I/O of the same files."""
    ms = {key: value * 1e3 for key, value in found.items()}
    print(f"{label}: {found['bytes'] / 1e6:.0f} MB state")
    plain = ms["plain write (sync)"]
    print(f"  sync save blocks {ms['sync']:.0f} ms; plain write of the same files {plain:.0f} ms: "
          f"save speed {found['plain write (sync)'] / found['sync']:.2f}x the plain write")
    if "sync, no fsync" in found:
        plain = found["plain write (sync, no fsync)"]
        print(f"  with fsync=False: {ms['sync, no fsync']:.0f} ms; plain write {plain * 1e3:.0f} ms: "
              f"{plain / found['sync, no fsync']:.2f}x the plain write")
    print(f"  async save blocks {ms['async']:.1f} ms = {found['async'] / found['sync']:.3f} of a sync save; one "
          f"in-memory copy of the state takes {ms['copy']:.1f} ms (async / copy {found['async'] / found['copy']:.2f})")
    print(f"  resume adds {ms['resume adds']:.0f} ms to fit (median of 3; the first {ms['first resume adds']:.0f} "
          f"ms); plain read {ms['plain read']:.0f} ms: restore speed {found['plain read'] / found['resume adds']:.2f}x "
          "the plain read")
    print(f"  in a fresh process (a user's resume): resume adds {ms['fresh resume adds']:.0f} ms, plain read "
          f"{ms['fresh plain read']:.0f} ms (medians of 3 processes): restore speed "
          f"{found['fresh plain read'] / found['fresh resume adds']:.2f}x the plain read")
    print(f"  reading with every checksum checked {ms['read and verify']:.0f} ms, of which checksums "
          f"{ms['verify only']:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=100)
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--storage", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument("--no-preemption", dest="preemption", action="store_false")
    args = parser.parse_args()
    width = width_for(args.megabytes)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
          f"keras {keras.__version__} on {keras.config.backend()}; "
          f"state ~{args.megabytes:.0f} MB (4 Dense {width}x{width} + Adam slots)")
    server = None
    try:
        with tempfile.TemporaryDirectory(dir=os.getcwd()) as folder:
            places = []
            if "local" in args.storage:
                places.append(("local", f"{folder}/ckpt", {}))
            if "s3" in args.storage:
                server, options = start_s3()
                places.append(("s3 (moto)", "s3://bench/ckpt", options))
            for label, url, options in places:
                found = measure(url, options, width, args.saves)
                megabytes = found["bytes"] / 1e6
                report(label, found)
                if args.preemption:
                    for model_width, name in ((0, "demo model"), (width, f"{megabytes:.0f} MB state")):
                        timing = preemption(url, options, model_width)
                        commit = timing["to commit"]
                        shown = f"{commit:.2f} s" if commit == commit else "0 (the step it stopped at was saved)"
                        print(f"  SIGTERM -> committed checkpoint ({name}): {shown}; -> exit "
                              f"{timing['to exit']:.2f} s (status {timing['status']})")
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
