"""Preemption in a fresh process: SIGTERM after the first committed checkpoint saves, runs the hooks, exits 143,
and the run resumes exactly; with two workers, both stop after the same step."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

from ktrainer.checkpoint import FsspecCheckpointIO
from ktrainer.fs import Location
from tests.checkpoint.test_resume import RUNNER, N, assert_same_run, inline, leg
from tests.helpers import read_scalars


class Lines:
    """The lines a child process prints, read in a thread, so a test can wait for one with a deadline."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.seen: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, predicate, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no such line within {timeout} s; saw: {self.seen[-10:]}"
            line = self._queue.get(timeout=remaining)
            assert line is not None, f"the process ended first; saw: {self.seen[-10:]}"
            self.seen.append(line)
            if predicate(line):
                return line

    def rest(self, timeout: float = 240.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while (line := self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))) is not None:
            self.seen.append(line)
        return self.seen


def test_sigterm_saves_runs_the_hooks_exits_143_and_resumes_exactly(tmp_path, straight_32):
    process = subprocess.Popen([sys.executable, str(RUNNER), str(tmp_path / "run"), "5000", "32-true", "-", "{}",
                                "--report"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = Lines(process)
    lines.wait_for(lambda line: line.startswith("saved ") and line != "saved None")  # the first committed one
    process.send_signal(signal.SIGTERM)
    seen = lines.rest()
    stderr = process.stderr.read()
    assert process.wait(timeout=240) == 143, stderr[-3000:]
    stopped_at = [int(line.split()[1]) for line in seen if line.startswith("step ")][-1]
    assert f"Preempted by SIGTERM at step {stopped_at}: checkpoint " in stderr
    assert "Resume with ckpt_path='last'" in stderr
    io = FsspecCheckpointIO(Location(str(tmp_path / "run" / "checkpoints")))
    newest = max((info for info in io.list(checksums=True) if info.valid), key=lambda info: info.committed)
    assert newest.step == stopped_at and newest.fields["reason"] in ("preemption", "epoch")
    [version] = os.listdir(tmp_path / "run" / "tensorboard")
    logged = read_scalars(str(tmp_path / "run" / "tensorboard" / version))["train/loss_step"]
    assert logged[-1][0] == stopped_at  # the loggers were flushed and closed before the exit

    whole = straight_32 if stopped_at < N else leg(tmp_path, tmp_path / "straight", stopped_at + 2, "32-true")
    second = inline(tmp_path / "run", whole["step"], "32-true", "last")
    assert [s for s, _ in second["losses"]] == list(range(stopped_at + 1, whole["step"] + 1))
    assert_same_run({"losses": whole["losses"][:stopped_at]}, second, whole)


WORKER = textwrap.dedent("""
    import json, os, sys
    import keras, numpy as np
    import ktrainer as kt

    class Net(kt.Module):
        def build(self):
            return keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                                     keras.layers.Dense(1)])
        def configure_optimizers(self):
            return keras.optimizers.Adam(0.05)
        def training_step(self, batch):
            x, y = batch
            return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))
        def train_data(self):
            rng = np.random.default_rng(0)
            x = rng.normal(size=(256, 4)).astype("float32")
            return x, x.sum(axis=1)

    class Report(kt.callbacks.Callback):
        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            print(f"worker {index} pid {os.getpid()} step {trainer.global_step}", flush=True)

    root, out = sys.argv[1], sys.argv[2]
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    trainer = kt.Trainer(num_nodes=2, max_steps=100000, batch_size=8, seed=0, default_root_dir=root,
                         enable_progress_bar=False, logger=False, callbacks=[Report()])
    try:
        trainer.fit(Net())
    except kt.Preempted as stop:
        with open(os.path.join(out, f"stopped_{index}.json"), "w") as f:
            json.dump({"step": trainer.global_step, "checkpoint": stop.checkpoint}, f)
        raise
""")


def test_two_workers_agree_to_stop_after_the_same_step_when_one_is_preempted(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    process = subprocess.Popen([sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", "2", "--",
                                sys.executable, str(script), str(root), str(out)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    lines = Lines(process)
    line = lines.wait_for(lambda line: line.startswith("worker 1 ") and int(line.split()[-1]) >= 3)
    os.kill(int(line.split()[3]), signal.SIGTERM)  # only the second worker gets the notice
    lines.rest()
    stderr = process.stderr.read()
    assert process.wait(timeout=240) == 143, stderr[-4000:]
    stopped = [json.loads((out / f"stopped_{i}.json").read_text()) for i in range(2)]
    assert stopped[0]["step"] == stopped[1]["step"]  # agreed: neither waits for the other in a collective
    step = stopped[0]["step"]
    assert stopped[0]["checkpoint"].endswith(f"step-{step:08d}")  # the chief saved where both stopped
    io = FsspecCheckpointIO(Location(str(root / "checkpoints")))
    assert any(info.valid and info.step == step for info in io.list(checksums=True))
