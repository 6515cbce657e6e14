"""Runs and branches: every save commits this run's state, 'last' is the newest commit, retention keeps what it must."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import FsspecCheckpointIO, find_checkpoint
from ktrainer.cli.main import main
from ktrainer.utils.fs import Location
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends


class Shifted(Classifier):
    """The same model on other data: a different run's weights."""

    def train_data(self):
        return self.x * -1.5 + 0.3, self.y


def fit(root, max_steps, module=None, ckpt_path=None, every=4, **checkpoint_options):
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=every, **checkpoint_options)
    trainer = kt.Trainer(max_steps=max_steps, batch_size=32, default_root_dir=str(root), enable_progress_bar=False,
                         logger=False, callbacks=[checkpoint])
    module = module or Classifier()
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer, module


def saved_model(root, name):
    resumable = find_checkpoint(str(Path(root) / "checkpoints" / name), Location(str(root)), {})
    return resumable, list(resumable.state["model"].values())


def assert_weights(arrays, module):
    for saved, variable in zip(arrays, module.model.variables, strict=True):
        np.testing.assert_array_equal(saved, np.asarray(variable))


def test_a_second_run_in_the_same_root_really_saves_its_own_state(tmp_path):
    first, _ = fit(tmp_path, 8)
    second, module = fit(tmp_path, 8, Shifted(lr=0.05))
    resumable, arrays = saved_model(tmp_path, "step-00000008")
    assert_weights(arrays, module)  # run B's weights, not run A's
    assert resumable.info.fields["run_id"] == second.run.run_id != first.run.run_id
    files = sorted(os.listdir(tmp_path / "checkpoints" / "step-00000008"))
    assert all(second.run.run_id in name for name in files if name != "manifest.json")  # A's files are gone
    assert find_checkpoint("last", Location(str(tmp_path / "checkpoints")), {}).info.fields["run_id"] == \
        second.run.run_id


def test_resuming_an_older_checkpoint_starts_a_branch_that_last_follows(tmp_path, capsys):
    original, _ = fit(tmp_path, 16, max_to_keep=None)  # saves 4, 8, 12, 16
    older = str(tmp_path / "checkpoints" / "step-00000004")
    branch, module = fit(tmp_path, 10, Shifted(), ckpt_path=older, max_to_keep=None)  # saves 8 and 10
    assert branch.run.parent == f"file://{os.path.realpath(older)}"
    last = find_checkpoint("last", Location(str(tmp_path / "checkpoints")), {})
    assert last.info.name == "step-00000010"  # the newest commit, not the highest step (16, abandoned)
    assert last.info.fields["run_id"] == branch.run.run_id
    assert last.info.fields["lineage"] == [original.run.run_id, branch.run.run_id]
    resumable, arrays = saved_model(tmp_path, "step-00000008")
    assert resumable.info.fields["run_id"] == branch.run.run_id  # the branch's 8 replaced the original's
    assert branch.checkpoint_callback.last_saved.endswith("step-00000010")

    assert main(["ckpt", "ls", str(tmp_path)]) == 0
    lines = {line[2:].split()[0]: line for line in capsys.readouterr().out.splitlines() if line[2:].startswith("step-")}
    on_branch = sorted(name for name, line in lines.items() if line.startswith("*"))
    assert on_branch == ["step-00000004", "step-00000008", "step-00000010"]
    assert not lines["step-00000016"].startswith("*") and not lines["step-00000012"].startswith("*")
    assert f"run {branch.run.run_id}  parent step-00000004" in lines["step-00000010"]

    again, _ = fit(tmp_path, 12, Shifted(), ckpt_path="last", max_to_keep=None)
    assert again.run.lineage == [original.run.run_id, branch.run.run_id, again.run.run_id]


@pytest.mark.parametrize("spelling", ["relative", "dot", "file-url", "trailing-slash"])
def test_retention_keeps_the_checkpoint_resumed_from_however_its_uri_is_spelled(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    fit("runs/exp", 8, every=2, max_to_keep=None)
    target = {"relative": "runs/exp/checkpoints/step-00000002", "dot": "./runs/exp/checkpoints/step-00000002",
              "file-url": f"file://{tmp_path}/runs/exp/checkpoints/step-00000002",
              "trailing-slash": "runs/exp/checkpoints/step-00000002/"}[spelling]
    fit("./runs/exp/", 14, ckpt_path=target, every=2, max_to_keep=1)
    kept = sorted(os.listdir(tmp_path / "runs" / "exp" / "checkpoints"))
    assert kept == ["step-00000002", "step-00000014"]


def test_retention_never_deletes_through_a_symlink_a_foreign_entry_or_a_newer_format(tmp_path):
    elsewhere, _ = fit(tmp_path / "elsewhere", 2, every=2)
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere" / "checkpoints" / "step-00000002", checkpoints / "step-00000001")
    (checkpoints / "step-00000003").write_text("a file of the user's, named like a checkpoint")
    fit(tmp_path / "newer", 2, every=2)
    newer = tmp_path / "newer" / "checkpoints" / "step-00000002"
    manifest = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps({**manifest, "format_version": 7, "step": 5}))
    os.rename(newer, checkpoints / "step-00000005")
    fit(tmp_path / "run", 12, every=2, max_to_keep=1)
    kept = sorted(os.listdir(checkpoints))
    assert kept == ["step-00000001", "step-00000003", "step-00000005", "step-00000012"]
    assert sorted(os.listdir(tmp_path / "elsewhere" / "checkpoints" / "step-00000002")) != []  # untouched
    with pytest.raises(kt.checkpoint.CheckpointError, match="format 7.*Upgrade ktrainer to resume it"):
        find_checkpoint(str(checkpoints / "step-00000005"), Location(str(checkpoints)), {})


def test_retention_leaves_checkpoints_of_another_callback_in_the_same_directory(tmp_path):
    fit(tmp_path, 8, every=2, monitor="train/loss_step", max_to_keep=None)  # another callback identity
    fit(tmp_path, 20, every=4, max_to_keep=1)  # a fresh run; its callback owns only its own checkpoints
    io = FsspecCheckpointIO(Location(str(tmp_path / "checkpoints")))
    owners = {info.name: info.fields["owner"] for info in io.list()}
    assert owners["step-00000020"] != owners["step-00000002"]
    assert sorted(owners) == ["step-00000002", "step-00000006", "step-00000020"]  # 4 and 8 were replaced by
    # the second run's saves of those names, which its own retention then deleted


def test_a_fresh_run_in_the_same_directory_never_prunes_an_earlier_runs_checkpoints(tmp_path):
    earlier, _ = fit(tmp_path, 20, every=2, max_to_keep=3)  # keeps 16, 18, 20
    fresh, _ = fit(tmp_path, 8, every=2, max_to_keep=2)  # started again without resuming: keeps its own 6, 8
    io = FsspecCheckpointIO(Location(str(tmp_path / "checkpoints")))
    runs = {info.name: info.fields["run_id"] for info in io.list() if info.valid}
    assert runs == {"step-00000006": fresh.run.run_id, "step-00000008": fresh.run.run_id,
                    "step-00000016": earlier.run.run_id, "step-00000018": earlier.run.run_id,
                    "step-00000020": earlier.run.run_id}
