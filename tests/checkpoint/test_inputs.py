"""Bad checkpoint input is a clear error before anything is written: it names the argument, the value, what fits."""

from __future__ import annotations

import fsspec
import pytest

import ktrainer as kt
from ktrainer.checkpoint import CheckpointError
from tests.helpers import Classifier

Checkpoint = kt.callbacks.ModelCheckpoint


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda root: kt.Trainer(default_root_dir=root, storage_options="abc"),
         r"storage_options must be a dict of fsspec options .* got 'abc' \(str\)"),
        (lambda root: kt.Trainer(default_root_dir=root, preemption_signals=["SIGFOO"]),
         "preemption_signals: 'SIGFOO' is not a signal of this platform. Known: .*SIGTERM"),
        (lambda root: kt.Trainer(default_root_dir=root, preemption_signals="SIGTERM"),
         r"preemption_signals must be a list of signal names such as \['SIGTERM', 'SIGUSR1'\]"),
        (lambda root: kt.Trainer(default_root_dir=root, preemption_signals=["SIGKILL"]),
         "SIGKILL cannot be caught"),
        (lambda root: kt.Trainer(default_root_dir=root, allow_global_batch_change="yes"),
         "allow_global_batch_change must be True or False, got 'yes'"),
        (lambda root: Checkpoint(storage_options=["key"]), r"storage_options must be a dict .* \(list\)"),
        (lambda root: Checkpoint(save_last="no"), r"save_last must be True or False, got 'no' \(str\)"),
        (lambda root: Checkpoint(async_save=1), "async_save must be True or False, got 1"),
        (lambda root: Checkpoint(dirpath=5), r"dirpath must be a non-empty path or URL string or None, got 5 \(int\)"),
        (lambda root: Checkpoint(monitor=3), "monitor must be a metric name such as 'val/loss'"),
        (lambda root: Checkpoint(max_to_keep=0), "max_to_keep must be an int >= 1 or None, got 0"),
        (lambda root: kt.Trainer(default_root_dir=root, callbacks=[Checkpoint(f"{root}/c"), Checkpoint(f"{root}/c/")]),
         "Two ModelCheckpoint callbacks write to the same dirpath 'file://.*/c'"),
        (lambda root: kt.Trainer(default_root_dir=root, callbacks=[Checkpoint(f"{root}/checkpoints"), Checkpoint()]),
         "Two ModelCheckpoint callbacks write to the same dirpath"),
    ],
)
def test_bad_arguments_fail_at_construction_and_write_nothing(tmp_path, make, match):
    with pytest.raises(ValueError, match=match):
        make(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_dirpath_that_is_an_existing_file(tmp_path):
    path = tmp_path / "ckpts"
    path.write_text("not a directory")
    with pytest.raises(ValueError, match=f"dirpath={str(path)!r} is an existing file; ModelCheckpoint needs a "
                                         "directory"):
        Checkpoint(str(path))
    remote = f"memory://inputs-{tmp_path.name}/ckpts"
    fsspec.filesystem("memory").pipe_file(remote, b"a file")
    trainer = kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(tmp_path / "root"),
                         enable_progress_bar=False, callbacks=[Checkpoint(remote)])
    with pytest.raises(ValueError, match=r"dirpath 'memory://.*/ckpts' is an existing file"):
        trainer.fit(Classifier())
    assert not (tmp_path / "root").exists() and trainer.global_step == 0


@pytest.mark.parametrize(
    ("ckpt_path", "error", "match"),
    [
        (5, ValueError, r"ckpt_path must be 'last', 'best', a checkpoint path or URI, or None; got 5 \(int\)"),
        ("", ValueError, "ckpt_path must be 'last', 'best'"),
        ("lst", ValueError, "ckpt_path='lst' is neither 'last' nor 'best' nor an existing path. Did you mean "
                            "ckpt_path='last'"),
        ("Best", ValueError, "Did you mean ckpt_path='best'"),
        ("best", CheckpointError, r"ckpt_path='best': no checkpoint under .*checkpoints records a monitored metric"),
    ],
)
def test_bad_ckpt_path_fails_before_anything_is_built_or_written(tmp_path, ckpt_path, error, match):
    trainer = kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False)
    with pytest.raises(error, match=match):
        trainer.fit(Classifier(), ckpt_path=ckpt_path)
    assert list(tmp_path.iterdir()) == [] and trainer.global_step == 0


def test_a_run_folder_given_as_ckpt_path_says_what_to_pass(tmp_path):
    kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(tmp_path / "run"), enable_progress_bar=False,
               logger=False).fit(Classifier())
    trainer = kt.Trainer(max_steps=4, batch_size=32, default_root_dir=str(tmp_path / "run"), enable_progress_bar=False,
                         logger=False)
    with pytest.raises(CheckpointError, match="is a run's folder, not a checkpoint. Pass ckpt_path='last'"):
        trainer.fit(Classifier(), ckpt_path=str(tmp_path / "run"))
    folder = str(tmp_path / "run" / "checkpoints")
    with pytest.raises(CheckpointError, match=rf"is a folder of checkpoints, not one checkpoint. Pass one of them "
                                              rf"\(the newest: {folder}/step-00000002\)"):
        trainer.fit(Classifier(), ckpt_path=folder)
    assert trainer.global_step == 0


def test_resuming_with_another_global_batch_is_an_error_unless_allowed(tmp_path):
    kt.Trainer(max_steps=3, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
               logger=False).fit(Classifier())  # 8 batches per epoch: stops at batch 3 of epoch 0
    trainer = kt.Trainer(max_steps=6, batch_size=16, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False)
    with pytest.raises(ValueError, match=r"saved with a global batch of 32 examples per step; this run's global "
                                         r"batch is 16 .* Trainer\(allow_global_batch_change=True\)"):
        trainer.fit(Classifier(), ckpt_path="last")
    assert trainer.global_step == 0
    allowed = kt.Trainer(max_steps=4, batch_size=16, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False, allow_global_batch_change=True)
    batches = []
    allowed.callbacks.append(type("Seen", (kt.callbacks.Callback,), {
        "on_train_batch_start": lambda self, t, m, batch_idx: batches.append(batch_idx)})())
    allowed.fit(Classifier(), ckpt_path="last")
    assert batches == [6]  # 3 batches of 32 examples = 96 examples = 6 batches of 16: the same example next


def test_last_with_no_checkpoint_yet_starts_a_new_run_with_a_warning(tmp_path):
    # A script that always passes ckpt_path="last" works on its first launch too, as in Lightning.
    trainer = kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False)
    with pytest.warns(UserWarning, match="ckpt_path='last': no checkpoint under .* yet; starting a new run"):
        trainer.fit(Classifier(), ckpt_path="last")
    assert trainer.global_step == 2 and trainer.run.parent is None


def test_last_with_only_invalid_checkpoints_is_an_error_that_says_what_to_do(tmp_path):
    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)  # an interrupted save, nothing else
    trainer = kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False)
    with pytest.warns(UserWarning, match="step-00000004 is not valid"):
        with pytest.raises(CheckpointError, match="no valid checkpoint under .* `ktrainer ckpt ls` lists them"):
            trainer.fit(Classifier(), ckpt_path="last")


def test_a_bare_checkpoint_name_as_ckpt_ls_prints_it_is_refused_with_the_full_path_to_pass(tmp_path):
    root = tmp_path / "run"
    kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(root), enable_progress_bar=False,
               logger=False).fit(Classifier())
    resuming = kt.Trainer(max_steps=4, batch_size=32, default_root_dir=str(root), enable_progress_bar=False,
                          logger=False)
    with pytest.raises(CheckpointError, match=r"step-00000002 is not a valid checkpoint: .* This run's checkpoint "
                                              r"directory has one of that name: pass ckpt_path='.*run/checkpoints/"
                                              r"step-00000002'"):
        resuming.fit(Classifier(), ckpt_path="step-00000002")
    assert resuming.global_step == 0
    with pytest.raises(CheckpointError) as other:
        resuming.fit(Classifier(), ckpt_path="step-00000099")
    assert "This run's checkpoint directory" not in str(other.value)
