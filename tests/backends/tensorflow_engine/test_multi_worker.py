"""Two worker processes on 127.0.0.1 (ktrainer launch): they train to identical weights, only the chief writes, and
a preemption notice to one of them stops both after the same step, checkpointed by the chief."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

from ktrainer.checkpoint import FsspecCheckpointIO
from ktrainer.utils.fs import Location
from tests.checkpoint.test_preemption import Lines

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
    trainer = kt.Trainer(num_nodes=2, max_steps=100000, batch_size=8, seed=0, log_every_n_steps=2,
                         default_root_dir=root, enable_progress_bar=False, callbacks=[Report()])
    module = Net()
    try:
        trainer.fit(module)
    except kt.Preempted as stop:
        np.savez(os.path.join(out, f"weights_{index}.npz"), *module.model.get_weights())
        with open(os.path.join(out, f"stopped_{index}.json"), "w") as f:
            json.dump({"step": trainer.global_step, "checkpoint": stop.checkpoint, "chief": trainer.is_global_zero,
                       "global_batch": trainer.global_batch_size, "log_dir": trainer.logger.log_dir}, f)
        raise
""")


def test_two_workers_train_alike_only_the_chief_writes_and_both_stop_on_one_preemption(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    process = subprocess.Popen([sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", "2", "--",
                                sys.executable, str(script), str(root), str(out)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    lines = Lines(process)
    # launch prefixes each line with the worker's index: "[worker 1] worker 1 pid P step S"
    line = lines.wait_for(lambda line: line.startswith("[worker 1] worker 1 ") and int(line.split()[-1]) >= 6)
    os.kill(int(line.split()[5]), signal.SIGTERM)  # only the second worker gets the notice
    lines.rest()
    stderr = process.stderr.read()
    assert process.wait(timeout=240) == 143, stderr[-4000:]
    assert "the workers stopped on a preemption signal (status 143)" in stderr
    assert all(line.startswith(("[worker 0] ", "[worker 1] ")) for line in lines.seen)

    stopped = [json.loads((out / f"stopped_{i}.json").read_text()) for i in range(2)]
    step = stopped[0]["step"]
    assert stopped[1]["step"] == step  # agreed: neither waits for the other in a collective
    assert [s["chief"] for s in stopped] == [True, False] and all(s["global_batch"] == 16 for s in stopped)
    assert all(s["checkpoint"].endswith(f"step-{step:08d}") for s in stopped)  # where the chief saved
    chief, worker = (np.load(out / f"weights_{i}.npz") for i in range(2))
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], worker[name])

    io = FsspecCheckpointIO(Location(str(root / "checkpoints")))
    assert any(info.valid and info.step == step for info in io.list(checksums=True))
    assert sorted(os.listdir(root)) == ["checkpoints", "tensorboard"]
    # One version folder, the chief's, though the other worker asked for its log_dir too.
    assert os.listdir(root / "tensorboard") == ["version_0"]
    assert stopped[0]["log_dir"] == str(root / "tensorboard" / "version_0")
    events = [f for f in os.listdir(root / "tensorboard" / "version_0") if f.startswith("events.out.tfevents")]
    assert len(events) == 1  # one writer, the chief
