"""Checkpoints on real object stores, S3 (moto) and GCS (the emulator) on 127.0.0.1, each test on both, and crash
safety: SIGKILL during saves loses nothing."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import fsspec
import pytest

import ktrainer as kt
from ktrainer.checkpoint.resume import find_checkpoint
from tests.checkpoint.resume_run import Net
from tests.checkpoint.test_preemption import Lines
from tests.checkpoint.test_resume import RUNNER, N, assert_same_run, inline, leg


def test_retention_on_object_stores(cloud_bucket):
    root, options = cloud_bucket
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2, max_to_keep=2, keep_every_n_steps=6)
    trainer = kt.Trainer(max_steps=10, batch_size=32, default_root_dir=f"{root}/run", storage_options=options,
                         callbacks=[checkpoint], enable_progress_bar=False, logger=False)
    trainer.fit(Net())
    fs = fsspec.filesystem(root.partition(":")[0], **options)
    kept = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/run/checkpoints"))
    assert kept == ["step-00000006", "step-00000008", "step-00000010"]
    assert all(info.valid for info in checkpoint.io.list(checksums=True))


def test_resume_from_a_cloud_uri_in_a_fresh_process_equals_the_straight_run(cloud_bucket, tmp_path, straight_32):
    root, options = cloud_bucket
    first = inline(f"{root}/run", 7, "32-true", "-", options)
    second = leg(tmp_path, f"{root}/run", N, "32-true", f"{root}/run/checkpoints/step-00000007", options)
    assert_same_run(first, second, straight_32)


def test_a_truncated_newest_checkpoint_in_the_cloud_falls_back(cloud_bucket):
    root, options = cloud_bucket
    kt.Trainer(max_steps=10, batch_size=32, default_root_dir=f"{root}/run", storage_options=options,
               enable_progress_bar=False, logger=False).fit(Net())  # epochs end at 5 and 10
    fs = fsspec.filesystem(root.partition(":")[0], **options)
    [newest] = fs.glob(f"{root}/run/checkpoints/step-00000010/model-00000.*.tensors")
    fs.pipe_file(newest, fs.cat_file(newest)[:50])
    trainer = kt.Trainer(max_steps=6, batch_size=32, default_root_dir=f"{root}/run", storage_options=options,
                         enable_progress_bar=False, logger=False)
    with pytest.warns(UserWarning, match="step-00000010 is not valid"):
        trainer.fit(Net(), ckpt_path="last")
    assert trainer.global_step == 6  # resumed at 5


def test_an_async_save_in_the_cloud_resumes_exactly(cloud_bucket, tmp_path, straight_32):
    root, options = cloud_bucket
    first = inline(f"{root}/run", 7, "32-true", "-", options, "--every-n-steps", "7", "--async-save")
    second = inline(f"{root}/run", N, "32-true", "last", options)
    assert_same_run(first, second, straight_32)


def _kill_one(run_root: str, options: dict, wanted: int, async_save: bool, cwd) -> list[int]:
    """Train (saving every step, maybe in the background) until `wanted` checkpoints are committed, then SIGKILL
    the process wherever it is (mid-step, mid-save, mid-retention). Returns the steps seen committed."""
    command = [sys.executable, str(RUNNER), run_root, "100000", "32-true", "-", json.dumps(options),
               "--every-n-steps", "1", "--max-to-keep", "2", "--report", *(["--async-save"] if async_save else [])]
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(process)
        committed = []
        while len(committed) < wanted:
            line = lines.wait_for(lambda line: line.startswith("saved ") and line != "saved None")
            committed.append(int(line.rsplit("-", 1)[1]))
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    return committed


def _kill_trials(root, options, trials, cwd, seed):
    """SIGKILL trainings at random moments after a random number of committed checkpoints (two at a time: a
    fresh process mostly waits for its imports), then check that 'last' is a valid checkpoint at least as new
    as the last one seen committed (every checksum checked, as resume reads it); the first also resumes."""
    chooser = random.Random(seed)
    plans = [(f"{root}/trial{trial}", chooser.randint(1, 5), chooser.random() < 0.5) for trial in range(trials)]
    with ThreadPoolExecutor(2) as pool:
        seen = list(pool.map(lambda plan: _kill_one(plan[0], options, plan[1], plan[2], cwd), plans))
    for trial, ((run_root, _, _), committed) in enumerate(zip(plans, seen, strict=True)):
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
    _kill_trials(str(tmp_path / "runs"), {}, 2, tmp_path, seed=1)


@pytest.mark.filterwarnings("ignore:Checkpoint .* is not valid")
@pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state")
def test_sigkill_at_random_moments_always_leaves_a_resumable_checkpoint_in_the_cloud(cloud_bucket, tmp_path):
    root, options = cloud_bucket
    _kill_trials(root, options, 2, tmp_path, seed=2)


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
