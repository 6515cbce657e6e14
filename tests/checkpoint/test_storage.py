"""Checkpoints on a real S3 server (moto on 127.0.0.1) and crash safety: SIGKILL during saves loses nothing."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import fsspec
import numpy as np
import pytest

import ktrainer as kt
import ktrainer.checkpoint
from ktrainer.checkpoint.resume import find_checkpoint
from tests.checkpoint.resume_run import Net
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


def _kill_trials(root, options, trials, cwd):
    """Start a run that saves every step, SIGKILL it at a random moment, and check it can resume."""
    env = {**os.environ, "KTRAINER_TEST_SAVE_EVERY_STEP": "1"}
    chooser = random.Random(1234)
    resumed_steps = []
    for trial in range(trials):
        run_root = f"{root}/trial{trial}"
        process = subprocess.Popen([sys.executable, str(RUNNER), run_root, "400", "32-true", "-", json.dumps(options)],
                                   cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(chooser.uniform(5.0, 8.0))  # start-up takes ~4 s; then a save every step
        process.send_signal(signal.SIGKILL)
        process.wait()
        trainer = kt.Trainer(max_steps=10_000, batch_size=32, default_root_dir=run_root, storage_options=options,
                             enable_progress_bar=False, logger=False)
        try:
            info, _ = find_checkpoint(trainer, "last")
        except kt.checkpoint.CheckpointError:
            continue  # killed before the first save finished: nothing to resume, nothing lost
        assert info.valid
        trainer.max_steps = info.step + 1
        trainer.fit(Net(), ckpt_path="last")
        assert trainer.global_step == info.step + 1
        resumed_steps.append(info.step)
    assert len(resumed_steps) >= trials // 2, resumed_steps


@pytest.mark.filterwarnings("ignore:Checkpoint .* is not valid")
def test_sigkill_during_saves_always_leaves_a_resumable_checkpoint_locally(tmp_path):
    _kill_trials(str(tmp_path / "runs"), {}, 10, tmp_path)


@pytest.mark.filterwarnings("ignore:Checkpoint .* is not valid")
def test_sigkill_during_saves_always_leaves_a_resumable_checkpoint_on_s3(s3_bucket, tmp_path):
    root, options = s3_bucket
    _kill_trials(root, options, 10, tmp_path)
