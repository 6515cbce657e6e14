"""Two worker processes on 127.0.0.1 (ktrainer launch): they train, agree on the weights, and only the chief writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

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

    root, out = sys.argv[1], sys.argv[2]
    trainer = kt.Trainer(num_nodes=2, max_steps=12, batch_size=8, seed=0, log_every_n_steps=2,
                         default_root_dir=root, enable_progress_bar=False)
    module = Net()
    trainer.fit(module)
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    np.savez(os.path.join(out, f"weights_{index}.npz"), *module.model.get_weights())
    with open(os.path.join(out, f"info_{index}.json"), "w") as f:
        json.dump({"global_batch": trainer.global_batch_size, "chief": trainer.is_global_zero,
                   "step": trainer.global_step, "loss": trainer.callback_metrics["train/loss_epoch"]}, f)
""")


def test_two_workers_train_to_identical_weights_and_only_the_chief_writes(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = subprocess.run([sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", "2", "--",
                           sys.executable, str(script), str(root), str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    chief, worker = (np.load(out / f"weights_{i}.npz") for i in range(2))
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], worker[name])
    infos = [json.loads((out / f"info_{i}.json").read_text()) for i in range(2)]
    assert [i["chief"] for i in infos] == [True, False]
    assert all(i["global_batch"] == 16 and i["step"] == 12 for i in infos)
    assert sorted(os.listdir(root)) == ["checkpoints", "tensorboard"]
    assert os.listdir(root / "checkpoints") == ["step-00000012"]
    assert os.listdir(root / "tensorboard") == ["version_0"]
    events = [f for f in os.listdir(root / "tensorboard" / "version_0") if f.startswith("events.out.tfevents")]
    assert len(events) == 1  # one writer, the chief
