"""Checkpoints on a real S3 server (moto on 127.0.0.1) and crash safety: SIGKILL during saves loses nothing."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys

import fsspec
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint.resume import find_checkpoint
from tests.checkpoint.resume_run import Net
from tests.checkpoint.test_preemption import Lines
from tests.checkpoint.test_resume import RUNNER, leg, weights


def test_retention_on_s3(s3_bucket):
    root, options = s3_bucket
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2, max_to_keep=2, keep_every_n_steps=6)
    trainer = kt.Trainer(max_steps=10, batch_size=32, default_root_dir=f"{root}/run", storage_options=options,
                         callbacks=[checkpoint], enable_progress_bar=False, logger=False)
    trainer.fit(Net())
    fs = fsspec.filesystem("s3", **options)
    kept = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/run/checkpoints"))
    assert kept == ["step-00000006", "step-00000008", "step-00000010"]
    assert all(info.valid for info in checkpoint.io.list(checksums=True))


def test_resume_from_an_s3_uri_in_a_fresh_process_equals_the_straight_run(s3_bucket, tmp_path):
    root, options = s3_bucket
    whole = leg(tmp_path, tmp_path / "local", 9, "32-true")
    first = leg(tmp_path, f"{root}/run", 7, "32-true", options=options)
    second = leg(tmp_path, f"{root}/run", 9, "32-true", f"{root}/run/checkpoints/step-00000007", options=options)
    assert [v for _, v in first["losses"] + second["losses"]] == pytest.approx([v for _, v in whole["losses"]],
                                                                               abs=1e-6)
    for resumed, reference in zip(weights(second), weights(whole), strict=True):
        np.testing.assert_allclose(resumed, reference, atol=1e-6)


def test_a_truncated_newest_checkpoint_on_s3_falls_back(s3_bucket):
    root, options = s3_bucket
    kt.Trainer(max_steps=10, batch_size=32, default_root_dir=f"{root}/run", storage_options=options,
               enable_progress_bar=False, logger=False).fit(Net())  # epochs end at 5 and 10
    fs = fsspec.filesystem("s3", **options)
    [newest] = fs.glob(f"{root}/run/checkpoints/step-00000010/model-00000.*.tensors")
    fs.pipe_file(newest, fs.cat_file(newest)[:50])
    trainer = kt.Trainer(max_steps=6, batch_size=32, default_root_dir=f"{root}/run", storage_options=options,
                         enable_progress_bar=False, logger=False)
    with pytest.warns(UserWarning, match="step-00000010 is not valid"):
        trainer.fit(Net(), ckpt_path="last")
    assert trainer.global_step == 6  # resumed at 5


def _kill_trials(root, options, trials, cwd, seed):
    """Run trainings that save every step (some in the background), SIGKILL each at a random moment after a random
    number of committed checkpoints, and check that 'last' is a valid checkpoint at least that new (every checksum
    checked, as resume reads it); the first trial also resumes training from it."""
    chooser = random.Random(seed)
    for trial in range(trials):
        run_root = f"{root}/trial{trial}"
        wanted = chooser.randint(1, 5)
        extra = ["--async-save"] if chooser.random() < 0.5 else []
        command = [sys.executable, str(RUNNER), run_root, "100000", "32-true", "-", json.dumps(options),
                   "--every-n-steps", "1", "--max-to-keep", "2", "--report", *extra]
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines = Lines(process)
        committed = []
        while len(committed) < wanted:
            line = lines.wait_for(lambda line: line.startswith("saved ") and line != "saved None")
            committed.append(int(line.rsplit("-", 1)[1]))
        process.send_signal(signal.SIGKILL)  # wherever it is now: mid-step, mid-save, mid-retention
        process.wait(timeout=60)
        trainer = kt.Trainer(max_steps=10_000, batch_size=32, default_root_dir=run_root, storage_options=options,
                             enable_progress_bar=False, logger=False)
        resumable = find_checkpoint("last", trainer.checkpoint_dir, options)
        assert resumable.info.valid and resumable.info.checksums_checked
        assert resumable.info.step >= committed[-1], (trial, committed, resumable.info.step)
        if trial:
            continue  # resuming reads exactly what was verified above; one training resume per test shows it
        again = kt.Trainer(max_steps=resumable.info.step + 1, batch_size=32, default_root_dir=run_root,
                           storage_options=options, enable_progress_bar=False, logger=False,
                           callbacks=[kt.callbacks.ModelCheckpoint(every_n_train_steps=1, max_to_keep=2)])
        again.fit(Net(), ckpt_path="last")
        assert again.global_step == resumable.info.step + 1


@pytest.mark.filterwarnings("ignore:Checkpoint .* is not valid")
@pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state")
def test_sigkill_at_random_moments_always_leaves_a_resumable_checkpoint_locally(tmp_path):
    _kill_trials(str(tmp_path / "runs"), {}, 5, tmp_path, seed=1)


@pytest.mark.filterwarnings("ignore:Checkpoint .* is not valid")
@pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state")
def test_sigkill_at_random_moments_always_leaves_a_resumable_checkpoint_on_s3(s3_bucket, tmp_path):
    root, options = s3_bucket
    _kill_trials(root, options, 5, tmp_path, seed=2)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Checkpoint .* is not valid")
@pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state")
def test_sigkill_more_trials_locally(tmp_path):
    _kill_trials(str(tmp_path / "runs"), {}, 15, tmp_path, seed=3)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Checkpoint .* is not valid")
@pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state")
def test_sigkill_more_trials_on_s3(s3_bucket, tmp_path):
    root, options = s3_bucket
    _kill_trials(root, options, 15, tmp_path, seed=4)
