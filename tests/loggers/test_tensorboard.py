"""TensorBoardLogger: event files read back, hyperparameters, versions, and remote roots (memory://, S3)."""

from __future__ import annotations

import glob
import os
from collections import Counter

import fsspec
import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

import ktrainer as kt
from tests.helpers import Classifier, read_hparams, read_scalars

pytestmark = pytest.mark.both_backends

SESSION_START = "_hparams_/session_start_info"


def count_summaries(log_dir: str, tag: str) -> int:
    """How many summaries with `tag` all the event files under `log_dir` hold (TensorBoard's reader, no dedup)."""
    files = sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")))
    return sum(value.tag == tag for path in files for event in EventFileLoader(path).Load()
               for value in event.summary.value)


def test_event_files_hold_the_logged_values_at_the_right_steps(tmp_path):
    trainer = kt.Trainer(max_epochs=2, batch_size=32, log_every_n_steps=4, default_root_dir=str(tmp_path),
                         enable_progress_bar=False)
    trainer.fit(Classifier(lr=0.05))
    log_dir = tmp_path / "tensorboard" / "version_0"
    assert trainer.logger.log_dir == str(log_dir)
    scalars = read_scalars(str(log_dir))
    assert [s for s, _ in scalars["train/loss_step"]] == [4, 8, 12, 16]
    assert [s for s, _ in scalars["train/loss_epoch"]] == [8, 16]
    assert [s for s, _ in scalars["val/loss"]] == [8, 16]
    assert scalars["val/loss"][-1][1] == pytest.approx(trainer.callback_metrics["val/loss"], rel=1e-6)
    assert scalars["train/loss_epoch"][-1][1] == pytest.approx(trainer.callback_metrics["train/loss_epoch"])
    assert [v for _, v in scalars["lr-Adam"]] == pytest.approx([0.05] * 4)
    assert [s for s, _ in scalars["perf/batches_per_sec"]] == [4, 8, 12, 16]  # from the end of the compiling step
    assert read_hparams(str(log_dir)) == {"lr": 0.05, "n": 256}


def test_epoch_is_written_once_per_logged_step(tmp_path):
    # Each log step also logs the learning rate, and an epoch end validation and the epoch's metrics:
    # the Trainer sends `epoch` with each of them.
    trainer = kt.Trainer(max_epochs=2, batch_size=32, log_every_n_steps=4, default_root_dir=str(tmp_path),
                         enable_progress_bar=False)
    trainer.fit(Classifier())
    epochs = read_scalars(trainer.logger.log_dir)["epoch"]
    assert epochs == [(4, 0.0), (8, 0.0), (12, 1.0), (16, 1.0)]


def test_a_resumed_run_has_one_hparams_session_and_one_epoch_per_step(tmp_path):
    def fit(max_epochs, ckpt_path=None):
        trainer = kt.Trainer(max_epochs=max_epochs, batch_size=32, log_every_n_steps=4,
                             default_root_dir=str(tmp_path), enable_progress_bar=False)
        trainer.fit(Classifier(lr=0.03), ckpt_path=ckpt_path)
        return trainer

    fit(1)
    resumed = fit(2, ckpt_path="last")
    log_dir = str(tmp_path / "tensorboard" / "version_0")
    assert resumed.logger.log_dir == log_dir
    assert os.listdir(tmp_path / "tensorboard") == ["version_0"]
    assert len(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))) == 2  # one per fit
    assert count_summaries(log_dir, SESSION_START) == 1
    assert read_hparams(log_dir) == {"lr": 0.03, "n": 256}
    scalars = read_scalars(log_dir)
    assert [s for s, _ in scalars["train/loss_step"]] == [4, 8, 12, 16]
    steps = Counter(step for step, _ in scalars["epoch"])
    assert sorted(steps) == [4, 8, 12, 16] and set(steps.values()) == {1}


def test_each_run_gets_the_next_version(tmp_path, quiet):
    for _ in range(2):
        kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False).fit(
            Classifier())
    assert sorted(os.listdir(tmp_path / "tensorboard")) == ["version_0", "version_1"]
    logger = kt.loggers.TensorBoardLogger(str(tmp_path), version=7)
    assert logger.log_dir.endswith("tensorboard/version_7")


def _download(fs, remote_dir, local_dir):
    os.makedirs(local_dir)
    for path in fs.ls(remote_dir, detail=False):
        fs.get_file(path, os.path.join(local_dir, os.path.basename(path)))


def test_memory_root_receives_the_event_files(tmp_path):
    root = "memory://tb-test-run"
    trainer = kt.Trainer(max_epochs=1, batch_size=64, log_every_n_steps=1, default_root_dir=root,
                         enable_progress_bar=False)
    trainer.fit(Classifier())
    assert trainer.logger.log_dir == f"{root}/tensorboard/version_0"
    fs = fsspec.filesystem("memory")
    _download(fs, "/tb-test-run/tensorboard/version_0", tmp_path / "copy")
    scalars = read_scalars(str(tmp_path / "copy"))
    assert [s for s, _ in scalars["train/loss_step"]] == [1, 2, 3, 4]
    fs.rm("/tb-test-run", recursive=True)


def test_s3_root_receives_event_files_that_tensorboard_reads(tmp_path, s3_bucket):
    root, options = s3_bucket
    trainer = kt.Trainer(max_epochs=2, batch_size=64, log_every_n_steps=2, default_root_dir=f"{root}/run",
                         storage_options=options, enable_progress_bar=False,
                         logger=[kt.loggers.TensorBoardLogger(), kt.loggers.CSVLogger()])
    trainer.fit(Classifier())
    fs = fsspec.filesystem("s3", **options)
    _download(fs, f"{root}/run/tensorboard/version_0", tmp_path / "copy")
    scalars = read_scalars(str(tmp_path / "copy"))
    assert [s for s, _ in scalars["train/loss_step"]] == [2, 4, 6, 8]
    assert [s for s, _ in scalars["val/acc"]] == [4, 8]
    csv_text = fs.cat_file(f"{root}/run/csv/version_0/metrics.csv").decode()
    assert csv_text.splitlines()[0].startswith("step,")
