"""Preemption: SIGTERM after the first committed checkpoint saves, runs the hooks, exits 143, and the run resumes
exactly (a fresh process); a signal during validation, during an async save or before the first step.
Two workers agreeing on the step: tests/backends/tensorflow_engine/test_multi_worker.py."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

import ktrainer as kt
from ktrainer.checkpoint import FsspecCheckpointIO
from ktrainer.utils.fs import Location
from tests.checkpoint.test_resume import RUNNER, N, assert_same_run, inline, leg
from tests.helpers import Classifier, read_scalars

pytestmark = pytest.mark.both_backends


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


class SignalAt(kt.callbacks.Callback):
    """Sends this process a SIGTERM from a hook, once, the first time `when(trainer)` holds there."""

    def __init__(self, hook: str, when=lambda trainer: True) -> None:
        self.sent = False
        self.when = when

        def send(trainer, module, *args):
            if not self.sent and self.when(trainer):
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)

        setattr(self, hook, send)


class Validations(kt.callbacks.Callback):
    def __init__(self) -> None:
        self.at: list[tuple[int, int]] = []

    def on_validation_end(self, trainer, module):
        self.at.append((trainer.global_step, trainer.progress.batch_in_epoch))


def _trainer(root, max_steps, *callbacks, **kwargs):
    return kt.Trainer(max_steps=max_steps, batch_size=32, default_root_dir=str(root), enable_progress_bar=False,
                      logger=False, callbacks=list(callbacks), seed=3, **kwargs)


def test_a_signal_during_validation_stops_there_and_the_resumed_run_repeats_that_validation(tmp_path):
    # 8 batches per epoch, validation every 3 batches: the one after batch 3 is interrupted, right after a
    # checkpoint of that very step (the preemption save differs from it: its validation is pending).
    step_saves = kt.callbacks.ModelCheckpoint(every_n_train_steps=3)
    trainer = _trainer(tmp_path, 8, step_saves, SignalAt("on_validation_start"), val_check_interval=3)
    with pytest.raises(kt.Preempted) as stopped:
        trainer.fit(Classifier())
    assert stopped.value.code == 143 and trainer.global_step == 3
    assert stopped.value.checkpoint.endswith("step-00000003")
    validations = Validations()
    resumed = _trainer(tmp_path, 8, kt.callbacks.ModelCheckpoint(every_n_train_steps=3), validations,
                       val_check_interval=3)
    resumed.fit(Classifier(), ckpt_path="last")
    assert validations.at == [(3, 3), (6, 6), (8, 8)]  # the interrupted one first, then the schedule goes on


def test_a_checkpoint_saved_where_a_validation_is_due_runs_it_first_on_resume(tmp_path):
    # The step save at step 3 comes in the batch hooks, before that step's validation (as in Lightning).
    straight = Validations()
    _trainer(tmp_path / "straight", 8, straight, val_check_interval=3).fit(Classifier())
    def step_saves():
        return kt.callbacks.ModelCheckpoint(every_n_train_steps=3, max_to_keep=None)

    _trainer(tmp_path / "run", 8, step_saves(), val_check_interval=3).fit(Classifier())
    resumed_validations = Validations()
    resumed = _trainer(tmp_path / "run", 8, step_saves(), resumed_validations, val_check_interval=3)
    resumed.fit(Classifier(), ckpt_path=str(tmp_path / "run" / "checkpoints" / "step-00000003"))
    assert straight.at == [(3, 3), (6, 6), (8, 8)]
    assert resumed_validations.at == straight.at  # the validation at step 3 is not lost


def test_a_signal_during_an_async_save_waits_for_it_and_exits_with_it_committed(tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2, async_save=True)
    trainer = _trainer(tmp_path, 100, checkpoint, SignalAt("on_train_batch_end", lambda t: checkpoint.io.in_flight))
    with pytest.raises(kt.Preempted) as stopped:
        trainer.fit(Classifier())
    step = trainer.global_step
    assert stopped.value.checkpoint.endswith(f"step-{step:08d}")
    io = FsspecCheckpointIO(Location(str(tmp_path / "checkpoints")))
    assert any(info.valid and info.step == step for info in io.list(checksums=True))
    assert checkpoint.io._executor is None  # the background writer was shut down


def test_a_signal_before_the_first_step_exits_without_training(tmp_path):
    trainer = _trainer(tmp_path, 10, SignalAt("on_fit_start"))
    with pytest.raises(kt.Preempted) as stopped:
        trainer.fit(Classifier())
    assert trainer.global_step == 0 and stopped.value.code == 143
    assert stopped.value.signal_name == "SIGTERM"


def test_signals_are_handed_back_after_fit(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    _trainer(tmp_path, 1).fit(Classifier())
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_failed_background_save_does_not_stop_the_preemption_save(tmp_path, monkeypatch):
    from ktrainer.checkpoint import FsspecCheckpointIO as Store

    real_write, calls = Store.write, []

    def fail_the_first(self, name, *args, **kwargs):
        calls.append(name)
        if len(calls) == 1:
            raise kt.checkpoint.CheckpointError(f"Saving checkpoint {name} failed: the disk went away.")
        return real_write(self, name, *args, **kwargs)

    monkeypatch.setattr(Store, "write", fail_the_first)
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2, async_save=True)
    signal_after = SignalAt("on_train_batch_end", lambda t: t.global_step == 2)
    trainer = _trainer(tmp_path, 100, checkpoint, signal_after)
    with pytest.raises(kt.Preempted) as stopped:
        trainer.fit(Classifier())
    assert calls == ["step-00000002", "step-00000002"]  # the failed one did not count as saved: saved again
    assert stopped.value.code == 143 and stopped.value.checkpoint.endswith("step-00000002")
