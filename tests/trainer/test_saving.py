"""`Trainer.save_checkpoint(path)`: one checkpoint where the user says, resumed exactly, never another run's lost."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import CheckpointError
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends


def trainer(root, epochs, **kwargs):
    return kt.Trainer(max_epochs=epochs, batch_size=32, seed=3, default_root_dir=str(root), enable_progress_bar=False,
                      logger=False, **kwargs)


def straight_run_weights(root):
    module = Classifier()
    trainer(root, 4).fit(module)
    return module.model.get_weights()


class SaveAtStep(kt.callbacks.Callback):
    """Saves to a path of its own in the middle of an epoch."""

    def __init__(self, path, step):
        self.path, self.step, self.saved = path, step, None

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        if trainer.global_step == self.step:
            self.saved = trainer.save_checkpoint(self.path)


def test_a_checkpoint_saved_to_a_path_after_fit_resumes_as_if_the_run_had_not_stopped(tmp_path):
    expected = straight_run_weights(tmp_path / "straight")
    first = trainer(tmp_path / "run", 2)
    first.fit(Classifier())
    [url] = first.save_checkpoint(tmp_path / "final")
    assert url.endswith("/final") and os.path.exists(tmp_path / "final" / "manifest.json")
    resumed, module = trainer(tmp_path / "run", 4), Classifier()
    resumed.fit(module, ckpt_path=str(tmp_path / "final"))
    assert resumed.global_step == 32
    for got, want in zip(module.model.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_checkpoint_saved_among_the_runs_is_outside_last_and_retention(tmp_path):
    first = trainer(tmp_path, 1, callbacks=[kt.callbacks.ModelCheckpoint(max_to_keep=1)])
    first.fit(Classifier())
    kept = tmp_path / "checkpoints" / "kept"
    first.save_checkpoint(kept)
    resumed = trainer(tmp_path, 3, callbacks=[kt.callbacks.ModelCheckpoint(max_to_keep=1)])
    resumed.fit(Classifier(), ckpt_path="last")
    # retention: the newest and the one resumed from (step 16 went); "kept" is left alone
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["kept", "step-00000008", "step-00000024"]
    assert resumed.checkpoint_callback.resumed_from == "step-00000008"  # "last" was the ModelCheckpoint's


def test_a_save_in_the_middle_of_an_epoch_to_s3_resumes_there(tmp_path, s3_bucket):
    root, options = s3_bucket
    expected = straight_run_weights(tmp_path / "straight")
    saver = SaveAtStep(f"{root}/kept/mid", step=11)
    trainer(tmp_path / "run", 2, callbacks=[saver], storage_options=options).fit(Classifier())
    assert saver.saved == [f"{root}/kept/mid"]
    resumed, module = trainer(tmp_path / "resumed", 4, storage_options=options), Classifier()
    resumed.fit(module, ckpt_path=f"{root}/kept/mid")
    for got, want in zip(module.model.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_another_runs_checkpoint_at_the_path_is_refused_and_this_runs_is_replaced(tmp_path):
    first = trainer(tmp_path / "a", 1)
    first.fit(Classifier())
    first.save_checkpoint(tmp_path / "shared")
    before = {name: (tmp_path / "shared" / name).read_bytes() for name in os.listdir(tmp_path / "shared")}
    other = trainer(tmp_path / "b", 1)
    other.fit(Classifier())
    with pytest.raises(CheckpointError, match="holds a checkpoint of another run .*step 8.*Save to another path"):
        other.save_checkpoint(tmp_path / "shared")
    assert {name: (tmp_path / "shared" / name).read_bytes() for name in os.listdir(tmp_path / "shared")} == before
    again = trainer(tmp_path / "a", 2)
    again.fit(Classifier(), ckpt_path=str(tmp_path / "shared"))  # the same lineage: its own to replace
    again.save_checkpoint(tmp_path / "shared")
    resumed = trainer(tmp_path / "a", 2)
    resumed.fit(Classifier(), ckpt_path=str(tmp_path / "shared"))
    assert resumed.global_step == 16  # the replacing checkpoint, at the end of epoch 2


def test_a_path_that_is_not_a_new_or_own_checkpoint_is_refused_before_anything_is_written(tmp_path):
    run = trainer(tmp_path, 1)
    run.fit(Classifier())
    with pytest.raises(ValueError, match="names like 'step-00000099' are a ModelCheckpoint's"):
        run.save_checkpoint(tmp_path / "checkpoints" / "step-00000099")
    with pytest.raises(CheckpointError, match=r"a folder holding what is not this checkpoint's \('step-00000008'\)"):
        run.save_checkpoint(tmp_path / "checkpoints")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="'todo.txt'"):
        run.save_checkpoint(tmp_path / "notes")
    with pytest.raises(CheckpointError, match="todo.txt is a file; a checkpoint is a folder"):
        run.save_checkpoint(tmp_path / "notes" / "todo.txt")
    assert sorted(os.listdir(tmp_path / "notes")) == ["todo.txt"]
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step-00000008"]
    with pytest.raises(TypeError):
        run.save_checkpoint(tmp_path / "x", {})  # storage_options is keyword-only (Lightning's 2nd is weights_only)


class AveragedClassifier(Classifier):
    def configure_optimizers(self):
        return keras.optimizers.Adam(self.lr, use_ema=True)


def test_saving_after_fit_with_moving_averages_in_the_weights_warns_it_will_not_resume_exactly(tmp_path):
    run = trainer(tmp_path, 1)
    run.fit(AveragedClassifier())
    with pytest.warns(UserWarning, match="moving averages .*save during fit"):
        run.save_checkpoint(tmp_path / "averaged")


def test_saving_before_anything_is_built_is_a_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError, match=r"save_checkpoint\(path\) needs a built model and optimizer"):
        trainer(tmp_path, 1).save_checkpoint(tmp_path / "early")
    assert not (tmp_path / "early").exists()
