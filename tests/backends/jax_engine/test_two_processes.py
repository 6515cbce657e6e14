"""Two JAX processes through `ktrainer launch` and jax.distributed on 127.0.0.1: one model, one writer."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.early import StartedProcess

HERE = Path(__file__).parent


def start_launch(folder: Path) -> StartedProcess:
    """A start (tests/early.py): two_process_run.py in two processes through `ktrainer launch`."""
    command = [sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", "2", "--", sys.executable,
               str(HERE / "no_tensorflow.py"), str(HERE / "two_process_run.py"), str(folder / "run")]
    return StartedProcess(command, folder, env={**os.environ, "PYTHONPATH": str(HERE.parents[2])})


@pytest.mark.starts_early(start=start_launch)
def test_two_launched_processes_end_with_bit_identical_weights_and_only_the_chief_writes(started):
    """Also, in the same processes: a time-triggered save follows the chief's clock, so a process whose clock
    runs apart saves at the same steps (a second fit, see two_process_run.py)."""
    launched = started(start_launch)
    tmp_path = launched.cwd
    root = tmp_path / "run"
    done = launched.finished()
    assert done.returncode == 0, done.stderr[-4000:]
    results = sorted((json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines()
                      if "RESULT " in line), key=lambda r: r["process"])
    assert [r["process"] for r in results] == [0, 1]
    assert [r["chief"] for r in results] == [True, False]
    assert all(r["replicas"] == 2 and r["step"] == 12 and not r["tensorflow_imported"] for r in results)
    assert results[0]["weights"] == results[1]["weights"]
    assert [r["most_in_flight"] for r in results] == [2, 2]  # the default window, dispatched ahead in both
    assert {r["last_model_path"].rpartition("/")[2] for r in results} == {"step-00000012"}  # known on both
    assert sorted(os.listdir(root / "checkpoints")) == ["step-00000006", "step-00000012"]
    assert os.listdir(root / "tensorboard") == ["version_0"]

    clocks = sorted((json.loads(line.split("CLOCK ", 1)[1]) for line in done.stdout.splitlines()
                     if "CLOCK " in line), key=lambda r: r["process"])
    assert [r["process"] for r in clocks] == [0, 1]
    time_saves = [[step for step, reason in r["saves"] if reason == "time"] for r in clocks]
    assert time_saves[0] and time_saves[0] == time_saves[1], clocks  # the other's clock never reached 60 s
    assert clocks[0]["saves"] == clocks[1]["saves"] and clocks[0]["last_model_path"] == clocks[1]["last_model_path"]
    saved = sorted(int(name.rpartition("-")[2]) for name in os.listdir(tmp_path / "run-clock" / "checkpoints"))
    assert saved == sorted({step for step, _ in clocks[0]["saves"]})
