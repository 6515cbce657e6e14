"""The `ktrainer` command: --help, demo, and fit on a user's file."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ktrainer.cli.main import main
from tests.helpers import read_scalars


def test_help_lists_the_commands():
    result = subprocess.run([sys.executable, "-m", "ktrainer.cli.main", "--help"], capture_output=True, text=True,
                            check=True)
    assert "demo" in result.stdout and "fit" in result.stdout


def test_demo_reaches_the_stated_accuracy_and_writes_logs(tmp_path, capsys):
    status = main(["demo", "--root", str(tmp_path), "--no-progress-bar"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "reached the expected 0.90" in out
    log_dir = tmp_path / "tensorboard" / "version_0"
    assert f"tensorboard --logdir {log_dir}" in out
    assert len(read_scalars(str(log_dir))["val/acc"]) == 5


def test_fit_runs_a_users_module_with_trainer_flags(tmp_path, capsys):
    user_file = tmp_path / "my_module.py"
    user_file.write_text(textwrap.dedent("""
        import keras
        import numpy as np
        import ktrainer as kt

        class Tiny(kt.Module):
            def __init__(self, lr=0.1):
                super().__init__()
                self.lr = lr

            def build(self):
                return keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(1)])

            def configure_optimizers(self):
                return keras.optimizers.SGD(self.lr)

            def training_step(self, batch):
                x, y = batch
                return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))

            def train_data(self):
                x = np.ones((40, 3), "float32")
                return x, x.sum(axis=1)
    """))
    status = main(["fit", f"{user_file}:Tiny", "--module-kwargs", '{"lr": 0.05}', "--max-epochs", "2",
                   "--batch-size", "8", "--limit-train-batches", "3", "--root", str(tmp_path / "run"),
                   "--log-every-n-steps", "1", "--no-progress-bar"])
    out = capsys.readouterr().out
    assert status == 0
    assert "Finished: epoch 2, global step 6." in out
    assert len(read_scalars(str(tmp_path / "run" / "tensorboard" / "version_0"))["train/loss_step"]) == 6


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fit", "nofile.py:Tiny"], "No such file: nofile.py"),
        (["fit", "no_colon"], "Expected FILE.py:ClassName"),
        (["demo", "--precision", "8-bit"], "precision='8-bit' is not supported"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
