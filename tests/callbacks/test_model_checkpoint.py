"""ModelCheckpoint: when it saves, what it keeps, how resume picks and refuses, async saves, export."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import CheckpointError
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.resume import find_checkpoint
from tests.helpers import Classifier, read_scalars

pytestmark = pytest.mark.both_backends


def names(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("step-"))


def fit(tmp_path, checkpoint=None, module=None, callbacks_first=(), **kwargs):
    callbacks = [*callbacks_first, *([checkpoint] if checkpoint else [])]
    trainer = kt.Trainer(batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False, logger=False,
                         callbacks=callbacks, **kwargs)
    module = module or Classifier()
    trainer.fit(module)
    return trainer, module


def test_default_saves_every_epoch_and_at_the_end_keeping_the_newest_three(tmp_path):
    trainer, _ = fit(tmp_path, max_epochs=5)
    assert names(tmp_path / "checkpoints") == ["step-00000024", "step-00000032", "step-00000040"]
    assert trainer.checkpoint_callback.last_saved.endswith("step-00000040")


def test_steps_milestones_and_top_k(tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2, max_to_keep=2, keep_every_n_steps=8,
                                              save_top_k=1, monitor="train/loss_step", mode="min")
    fit(tmp_path, checkpoint, max_epochs=3)
    kept = names(tmp_path / "checkpoints")
    losses = {c.name: c.fields["metrics"]["train/loss_step"] for c in checkpoint.io.list()}
    best = min(losses, key=losses.get)
    expected = {"step-00000022", "step-00000024", "step-00000008", "step-00000016", best}
    assert set(kept) == expected  # the newest two, the milestones, and the best by the lowest step loss
    assert checkpoint.best_value == min(losses.values()) or losses[best] <= checkpoint.best_value


def test_best_model_path_names_the_checkpoint_best_loads_also_after_a_resume(tmp_path):
    def checkpoint(**kwargs):  # the best by the highest loss: an early checkpoint, kept only as the best
        return kt.callbacks.ModelCheckpoint(monitor="val/loss", mode="max", max_to_keep=1, **kwargs)

    first = checkpoint(save_top_k=1)
    trainer, _ = fit(tmp_path, first, max_epochs=3)
    losses = {info.url: info.fields["metrics"]["val/loss"] for info in first.io.list()}
    best = max(losses, key=losses.get)
    assert (first.best_model_path, first.best_model_score) == (best, losses[best])
    assert first.last_model_path == first.last_saved and first.last_model_path.endswith("step-00000024")
    assert find_checkpoint("best", trainer.checkpoint_dir, {}).info.url == first.best_model_path
    resumed = checkpoint(save_top_k=1)
    kt.Trainer(max_epochs=4, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False, logger=False,
               callbacks=[resumed]).fit(Classifier(), ckpt_path="last")
    losses = {info.url: info.fields["metrics"]["val/loss"] for info in resumed.io.list()}
    assert resumed.best_model_path == max(losses, key=losses.get)  # the first run's, unless epoch 4 beat it
    unkept = checkpoint(save_top_k=0, dirpath=str(tmp_path / "unkept"))
    fit(tmp_path, unkept, max_epochs=3)
    assert names(tmp_path / "unkept") == ["step-00000024"]
    assert unkept.best_model_path is None and unkept.best_value is not None  # retention may delete the best


class LevelScore(Classifier):
    def on_validation_epoch_end(self):
        self.log("val/level", 1.0)  # levels off from the first validation


def test_on_a_tie_best_is_the_first_checkpoint_to_reach_the_value_for_path_retention_and_loading(tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(monitor="val/level", mode="max", save_top_k=1, max_to_keep=1)
    trainer, _ = fit(tmp_path, checkpoint, module=LevelScore(), max_epochs=3)
    assert checkpoint.best_model_path.endswith("step-00000008")
    assert names(tmp_path / "checkpoints") == ["step-00000008", "step-00000024"]
    assert find_checkpoint("best", trainer.checkpoint_dir, {}).info.url == checkpoint.best_model_path


def test_after_fit_best_is_this_runs_best_not_a_better_one_of_an_earlier_run_in_the_directory(tmp_path):
    def checkpoint():
        return kt.callbacks.ModelCheckpoint(monitor="val/loss", save_top_k=1)

    fit(tmp_path, checkpoint(), module=Classifier(lr=3e-2), max_epochs=3)  # a good earlier run: steps 8, 16, 24
    later = checkpoint()
    trainer = kt.Trainer(max_epochs=1, batch_size=64, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False, callbacks=[later])
    module = Classifier(lr=0.0)  # a fresh run that learns nothing: its best is worse than the earlier run's
    trainer.fit(module)
    assert later.best_model_path.endswith("step-00000004")
    assert find_checkpoint("best", trainer.checkpoint_dir, {}).info.url.endswith("step-00000024")  # by manifests
    assert trainer.validate(module, ckpt_path="best") == trainer.validate(module, ckpt_path=later.best_model_path)


class ValidationLosses(kt.callbacks.Callback):
    def __init__(self):
        self.at = {}

    def on_validation_end(self, trainer, module):
        self.at[trainer.global_step] = trainer.callback_metrics["val/loss"]


def test_with_a_monitor_validations_inside_epochs_are_saved_ranked_by_what_they_measured(tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(monitor="val/loss", max_to_keep=None)
    losses = ValidationLosses()
    fit(tmp_path, checkpoint, max_epochs=2, val_check_interval=4, callbacks_first=[losses])
    saved = {info.step: info.fields for info in checkpoint.io.list()}
    assert sorted(saved) == [4, 8, 12, 16] and sorted(losses.at) == [4, 8, 12, 16]
    assert {step: fields["metrics"]["val/loss"] for step, fields in saved.items()} == losses.at
    assert [saved[step]["reason"] for step in (4, 8)] == ["validation", "epoch"]
    best = min(losses.at, key=losses.at.get)
    assert checkpoint.best_model_path.endswith(f"step-{best:08d}")
    resumed = ValidationLosses()
    kt.Trainer(max_epochs=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False, logger=False,
               val_check_interval=4, callbacks=[resumed, kt.callbacks.ModelCheckpoint(monitor="val/loss",
                                                                                       max_to_keep=None)]).fit(
        Classifier(), ckpt_path=str(tmp_path / "checkpoints" / "step-00000004"))
    assert sorted(resumed.at) == [8, 12, 16]  # saved after its validation: not validated again


def test_last_falls_back_over_a_corrupt_newest_checkpoint_with_a_warning(tmp_path):
    fit(tmp_path, max_epochs=2)
    [newest] = (tmp_path / "checkpoints" / "step-00000016").glob("model-00000.*.tensors")
    newest.write_bytes(newest.read_bytes()[:100])
    trainer = kt.Trainer(max_epochs=3, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False)
    with pytest.warns(UserWarning, match=r"step-00000016 is not valid \(model-00000\.\w+-2\.tensors has 100 bytes"):
        trainer.fit(Classifier(), ckpt_path="last")
    assert trainer.global_step == 24  # resumed at step 8, trained epochs 2 and 3
    assert (tmp_path / "checkpoints" / "step-00000008").exists()  # the one it resumed from is kept


def test_a_specific_corrupt_checkpoint_is_an_error_and_nothing_changes(tmp_path):
    fit(tmp_path, max_epochs=1)
    target = tmp_path / "checkpoints" / "step-00000008"
    [optimizer] = target.glob("optimizer-00000.*.tensors")
    optimizer.write_bytes(b"garbage")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    trainer = kt.Trainer(max_epochs=3, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False)
    expected = r"step-00000008 is not a valid checkpoint: optimizer-00000\.\w+-1\.tensors has 7 bytes"
    with pytest.raises(CheckpointError, match=expected):
        trainer.fit(Classifier(), ckpt_path=str(target))
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert trainer.global_step == 0


def test_best_resumes_from_the_best_monitored_checkpoint(tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(save_top_k=1, monitor="val/loss", max_to_keep=1)
    fit(tmp_path, checkpoint, max_epochs=3)
    losses = {c.name: c.fields["metrics"]["val/loss"] for c in checkpoint.io.list()}
    best_name = min(losses, key=losses.get)
    same = kt.callbacks.ModelCheckpoint(save_top_k=1, monitor="val/loss", max_to_keep=1)
    trainer = kt.Trainer(max_epochs=4, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False, callbacks=[same])
    trainer.fit(Classifier(), ckpt_path="best")
    assert trainer.checkpoint_callback.resumed_from == best_name


class Wider(Classifier):
    def build(self):
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(32, activation="relu"),
                                 keras.layers.Dense(3, dtype="float32")])


def test_a_checkpoint_of_another_model_is_refused_before_anything_loads(tmp_path):
    fit(tmp_path, max_epochs=1)
    trainer = kt.Trainer(max_epochs=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False)
    module = Wider()
    expected = r"(?s)does not match this model.*nothing was loaded.*\(20, 16\) vs .*\(20, 32\)"
    with pytest.raises(ValueError, match=expected):
        trainer.fit(module, ckpt_path="last")
    assert trainer.global_step == 0


def test_async_save_writes_the_same_checkpoints_and_waits_at_the_end(tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=4, async_save=True, max_to_keep=None)
    trainer, module = fit(tmp_path, checkpoint, max_epochs=2)
    assert names(tmp_path / "checkpoints") == ["step-00000004", "step-00000008", "step-00000012", "step-00000016"]
    assert all(info.valid for info in checkpoint.io.list(checksums=True))


def test_a_background_failure_is_raised_by_fit_and_the_writer_thread_stops(tmp_path, monkeypatch):
    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(FsspecCheckpointIO, "write", fail)
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=4, async_save=True)
    trainer = kt.Trainer(max_epochs=1, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False, callbacks=[checkpoint])
    with pytest.raises(OSError, match="disk full"):
        trainer.fit(Classifier())
    assert trainer.global_step >= 4
    assert checkpoint.io._executor is None  # shut down when fit ended, also on this error


def test_export_keras_loads_in_a_fresh_process(tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(export_keras=True, monitor="val/loss", save_top_k=1)
    _, module = fit(tmp_path, checkpoint, max_epochs=2)
    exported = tmp_path / "checkpoints" / "export"
    assert sorted(os.listdir(exported)) == ["best.keras", "last.keras"]
    x = module.x[:4]
    np.save(tmp_path / "x.npy", x)
    code = ("import keras, numpy as np, sys; m = keras.saving.load_model(sys.argv[1]); "
            "print(repr(keras.ops.convert_to_numpy(m(np.load(sys.argv[2]))).tolist()))")
    done = subprocess.run([sys.executable, "-c", code, str(exported / "last.keras"), str(tmp_path / "x.npy")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    reloaded = eval(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(reloaded, keras.ops.convert_to_numpy(module.model(x)), rtol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="save_top_k needs monitor"):
        kt.callbacks.ModelCheckpoint(save_top_k=2)
    with pytest.raises(ValueError, match="every_n_train_steps must be an int >= 1"):
        kt.callbacks.ModelCheckpoint(every_n_train_steps=0)
    with pytest.raises(ValueError, match="ModelCheckpoint but enable_checkpointing=False"):
        kt.Trainer(callbacks=[kt.callbacks.ModelCheckpoint()], enable_checkpointing=False)


def test_a_resumed_run_appends_to_the_same_tensorboard_run(tmp_path):
    kt.Trainer(max_epochs=1, batch_size=32, log_every_n_steps=4, default_root_dir=str(tmp_path),
               enable_progress_bar=False).fit(Classifier())
    kt.Trainer(max_epochs=2, batch_size=32, log_every_n_steps=4, default_root_dir=str(tmp_path),
               enable_progress_bar=False).fit(Classifier(), ckpt_path="last")
    assert os.listdir(tmp_path / "tensorboard") == ["version_0"]
    steps = [step for step, _ in read_scalars(str(tmp_path / "tensorboard" / "version_0"))["train/loss_step"]]
    assert steps == [4, 8, 12, 16]


def test_train_time_interval(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000, 7))  # every reading of the clock is 7 "seconds" later
    monkeypatch.setattr("ktrainer.callbacks.model_checkpoint.time.monotonic", lambda: next(clock))
    checkpoint = kt.callbacks.ModelCheckpoint(train_time_interval=20, save_last=False, max_to_keep=None)
    fit(tmp_path, checkpoint, max_epochs=1)
    saved = [int(n.split("-")[1]) for n in names(tmp_path / "checkpoints")]
    assert len(saved) >= 2 and saved == sorted(saved)
    assert saved[0] < 8  # by time, within the epoch, not only at its end
