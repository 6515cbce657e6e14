"""Dispatch-ahead (`Trainer(max_in_flight=2)`, JAX's default) trains, logs and saves exactly as one call at a time.

Each scenario runs twice in this JAX process (4 virtual CPU devices), with `max_in_flight=1` and with the
default window, and compares what the user relies on bit for bit: the final weights, every logged value at
its step, and every checkpoint's tensors and progress. The window is watched, so a scenario that should
keep two calls in flight fails if it quietly ran one at a time.
"""

from __future__ import annotations

import glob
import json
import os
import signal
from pathlib import Path

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.backends.jax import runners as jax_runners
from ktrainer.callbacks import model_checkpoint
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.jax_only


class Recorder(kt.loggers.Logger):
    """Every value the Trainer logs, with its step, in order (but the wall-clock rates, `perf/`)."""

    def __init__(self, signal_at: int | None = None) -> None:
        super().__init__()
        self.series: list[tuple[int, dict[str, float]]] = []
        self.signal_at = signal_at

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.series.append((step, {key: value for key, value in metrics.items() if not key.startswith("perf/")}))
        if step == self.signal_at:  # a preemption notice arrives while a later call may be in flight
            os.kill(os.getpid(), signal.SIGTERM)

    def log_hyperparams(self, params: dict) -> None:
        pass


@pytest.fixture
def most_in_flight(monkeypatch) -> list[int]:
    """The most calls the training runner held in flight, at each dispatch."""
    seen: list[int] = []
    dispatch = jax_runners.TrainRunner.dispatch

    def watched(self, *args, **kwargs):
        call = dispatch(self, *args, **kwargs)
        seen.append(self._in_flight)
        return call

    monkeypatch.setattr(jax_runners.TrainRunner, "dispatch", watched)
    return seen


def fit(root: Path, window: int | None, *, data=None, callbacks=(), ckpt_path=None, signal_at=None,
        **options) -> dict:
    """One fit of an Adam regressor; what it logged, its weights and checkpoints."""
    recorder = Recorder(signal_at)
    settings = {"max_steps": 19, "batch_size": 8, "seed": 3, "val_check_interval": 5, **options}
    if window is not None:
        settings["max_in_flight"] = window
    trainer = kt.Trainer(default_root_dir=str(root), logger=recorder, enable_progress_bar=False,
                         log_every_n_steps=1, callbacks=list(callbacks), **settings)
    module = Regressor(lr=0.05, optimizer="adam")
    x, y = regression_data(64)
    error = None
    try:
        trainer.fit(module, (x, y) if data is None else data, (x[:16], y[:16]), ckpt_path=ckpt_path)
    except (kt.Preempted, ValueError) as raised:
        error = raised
    return {"series": recorder.series, "weights": module.model.get_weights(), "step": trainer.global_step,
            "checkpoints": checkpoints(root), "error": error}


def checkpoints(root: Path) -> dict[str, dict]:
    """Each checkpoint's tensor files (bytes) and saved progress, by checkpoint name."""
    found = {}
    for folder in sorted(glob.glob(str(root / "checkpoints" / "step-*"))):
        files = {Path(path).name.split(".")[0]: tensors(Path(path).read_bytes())
                 for path in glob.glob(f"{folder}/*.tensors")}
        trainer_file, = glob.glob(f"{folder}/trainer.*.json")
        progress = json.loads(Path(trainer_file).read_text())["progress"]
        found[Path(folder).name] = {"tensors": files, "progress": progress}
    return found


def tensors(content: bytes) -> list[tuple[str, list[int], bytes]]:
    """A tensor file's arrays in order: dtype, shape, raw bytes (the names hold the model's Keras name, which
    differs between two models built in one process)."""
    size = int.from_bytes(content[:8], "little")
    header, data = json.loads(content[8:8 + size]), content[8 + size:]
    return [(entry["dtype"], entry["shape"], data[entry["offset"]:entry["offset"] + entry["nbytes"]])
            for _, entry in sorted((key.split(":")[0], entry) for key, entry in header.items())]


def assert_same_run(one_at_a_time: dict, ahead: dict) -> None:
    assert ahead["step"] == one_at_a_time["step"]
    assert ahead["series"] == one_at_a_time["series"]  # every value at its step, in order, bit for bit
    for got, expected in zip(ahead["weights"], one_at_a_time["weights"], strict=True):
        np.testing.assert_array_equal(got, expected)
    assert ahead["checkpoints"].keys() == one_at_a_time["checkpoints"].keys()
    assert ahead["checkpoints"] == one_at_a_time["checkpoints"]


@pytest.mark.parametrize("options", [
    {"callbacks": "every_3"},
    {"callbacks": "every_4", "steps_per_execution": 3, "max_steps": 17},
    {"callbacks": "every_3", "devices": 2, "val_check_interval": 3},
    {"callbacks": "every_3", "accumulate_grad_batches": 2, "max_steps": 9},
], ids=["saves_validation_epochs_max_steps", "three_per_call", "two_devices", "accumulated"])
def test_a_window_of_two_trains_logs_and_saves_exactly_as_one(tmp_path, most_in_flight, options):
    every = int(options.pop("callbacks").split("_")[1])

    def run(window, name):
        saves = kt.callbacks.ModelCheckpoint(every_n_train_steps=every, max_to_keep=None)
        return fit(tmp_path / name, window, callbacks=[saves], **options)

    one_at_a_time = run(1, "one")
    assert max(most_in_flight) == 1
    most_in_flight.clear()
    ahead = run(None, "ahead")
    assert max(most_in_flight) == 2, "the default window kept no second call in flight"
    assert len(ahead["checkpoints"]) >= 3 and ahead["series"]
    assert_same_run(one_at_a_time, ahead)


def test_a_time_triggered_save_is_decided_at_dispatch_and_saves_that_step(tmp_path, monkeypatch, most_in_flight):
    def run(window, name):
        ticks = iter(range(10_000))  # a clock that moves one second each time a save is considered
        monkeypatch.setattr(model_checkpoint.time, "monotonic", lambda: float(next(ticks)))
        saves = kt.callbacks.ModelCheckpoint(train_time_interval=4.5, max_to_keep=None, save_last=False)
        return fit(tmp_path / name, window, callbacks=[saves], val_check_interval=None)

    one_at_a_time, ahead = run(1, "one"), run(2, "ahead")
    assert max(most_in_flight) == 2
    assert len(ahead["checkpoints"]) >= 3
    assert_same_run(one_at_a_time, ahead)
    for saved in ahead["checkpoints"].values():  # each holds the state of the step it is named after
        assert saved["progress"]["global_step"] > 0


def test_early_stopping_at_a_validation_inside_an_epoch_stops_at_the_same_step(tmp_path, most_in_flight):
    def run(window, name):
        stop = kt.callbacks.EarlyStopping(monitor="val/loss", min_delta=1e9, patience=1)
        return fit(tmp_path / name, window, callbacks=[stop], val_check_interval=3, max_steps=40)

    one_at_a_time, ahead = run(1, "one"), run(2, "ahead")
    assert max(most_in_flight) == 2
    assert ahead["step"] == 6  # stopped at its second validation, mid-epoch
    assert_same_run(one_at_a_time, ahead)


def test_a_keras_callback_with_a_batch_hook_keeps_one_call_in_flight(tmp_path, most_in_flight):
    seen = []

    def run(window, name):
        hook = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
        return fit(tmp_path / name, window, callbacks=[kt.callbacks.KerasCallback(hook)])

    one_at_a_time, ahead = run(1, "one"), run(2, "ahead")
    assert max(most_in_flight) == 1  # it may read the weights: each call is read before the next
    assert len(seen) == 38
    assert_same_run(one_at_a_time, ahead)


def failing_batches(fail_at: int):
    x, y = regression_data(64)
    for index in range(100):
        if index == fail_at:
            raise ValueError(f"bad record in batch {index}")
        rows = slice(8 * index % 64, 8 * index % 64 + 8)
        yield x[rows], y[rows]


def test_a_data_error_surfaces_after_every_step_before_it_is_trained_and_logged(tmp_path, most_in_flight):
    one_at_a_time = fit(tmp_path / "one", 1, data=failing_batches(7), val_check_interval=None)
    ahead = fit(tmp_path / "ahead", 2, data=failing_batches(7), val_check_interval=None)
    assert max(most_in_flight) == 2
    assert "bad record in batch 7" in str(ahead["error"]) and str(ahead["error"]) == str(one_at_a_time["error"])
    assert ahead["step"] == 7
    assert_same_run(one_at_a_time, ahead)


def test_a_preemption_signal_with_a_call_in_flight_saves_the_step_it_reached_and_resumes_exactly(tmp_path):
    straight = fit(tmp_path / "straight", 1, val_check_interval=None)
    preempted = fit(tmp_path / "run", 2, val_check_interval=None, signal_at=5)
    assert isinstance(preempted["error"], kt.Preempted)
    stopped_at = preempted["step"]
    assert stopped_at in (5, 6)  # the call dispatched before the signal was seen is trained and accounted
    saved = preempted["checkpoints"][f"step-{stopped_at:08d}"]
    assert saved["progress"]["global_step"] == stopped_at
    assert sorted({step for step, _ in preempted["series"]}) == list(range(1, stopped_at + 1))
    assert preempted["series"] == [(step, values) for step, values in straight["series"] if step <= stopped_at]
    resumed = fit(tmp_path / "run", 2, val_check_interval=None, ckpt_path="last")
    assert resumed["step"] == 19
    for got, expected in zip(resumed["weights"], straight["weights"], strict=True):
        np.testing.assert_array_equal(got, expected)
