"""Every kind of damage to the newest checkpoint: 'last' warns, names it, takes the previous one, changes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ktrainer as kt
from ktrainer.checkpoint import CheckpointError, find_checkpoint
from ktrainer.utils.fs import Location
from tests.helpers import Classifier


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def _rewrite_manifest(directory: Path, change) -> None:
    manifest = _manifest(directory)
    change(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _flip_a_bit(directory: Path) -> None:
    [shard] = directory.glob("model-00000.*.tensors")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))


def _truncate_a_shard(directory: Path) -> None:
    [shard] = directory.glob("optimizer-00000.*.tensors")
    shard.write_bytes(shard.read_bytes()[:-7])


def _wrong_checksum(directory: Path) -> None:
    def change(manifest):
        manifest["files"][0]["crc32c"] = f"{(int(manifest['files'][0]['crc32c'], 16) ^ 1):08x}"
    _rewrite_manifest(directory, change)


def _flip_commit_time(directory: Path) -> None:
    data = (directory / "manifest.json").read_bytes()
    position = data.index(b'"committed": ') + len(b'"committed": ') + 2
    (directory / "manifest.json").write_bytes(data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1:])


def _entry_without_size(directory: Path) -> None:
    _rewrite_manifest(directory, lambda manifest: manifest["files"][1].pop("size"))


def _non_numeric_step(directory: Path) -> None:
    _rewrite_manifest(directory, lambda manifest: manifest.update(step="eight"))


def _path_traversal(directory: Path) -> None:
    _rewrite_manifest(directory, lambda manifest: manifest["files"][0].update(name="../../outside.tensors"))


def _absurd_size(directory: Path) -> None:
    _rewrite_manifest(directory, lambda manifest: manifest["files"][0].update(size=2**50))


DAMAGE = {
    "bit flip": (_flip_a_bit, "does not match its crc32c checksum"),
    "wrong checksum": (_wrong_checksum, "manifest does not match its own checksum"),
    "flipped commit time": (_flip_commit_time, "manifest does not match its own checksum"),
    "truncated shard": (_truncate_a_shard, "(truncated)"),
    "manifest is a list": (lambda d: (d / "manifest.json").write_text("[1, 2]"), "manifest is a JSON list"),
    "manifest is null": (lambda d: (d / "manifest.json").write_text("null"), "manifest is a JSON NoneType"),
    "truncated manifest": (lambda d: (d / "manifest.json").write_bytes((d / "manifest.json").read_bytes()[:99]),
                           "manifest is not valid JSON"),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), "no manifest (an interrupted save)"),
    "entry without size": (_entry_without_size, "has no integer size"),
    "non-numeric step": (_non_numeric_step, "manifest step 'eight' is not a non-negative integer"),
    "path traversal": (_path_traversal, "unsafe or missing name '../../outside.tensors'"),
    "absurd size": (_absurd_size, "declares an impossible size"),
}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _copy(template: Path, root: Path) -> Path:
    for name, data in _tree(template).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run that committed step-00000004 and step-00000008 (a template copied by each test)."""
    root = tmp_path_factory.mktemp("saved")
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=4, save_last=False)
    kt.Trainer(max_steps=8, batch_size=32, default_root_dir=str(root), enable_progress_bar=False, logger=False,
               callbacks=[checkpoint]).fit(Classifier())
    return root


@pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state")
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_last_falls_back_over_damage_with_a_warning_and_changes_nothing(saved, tmp_path, kind):
    damage, reason = DAMAGE[kind]
    root = _copy(saved, tmp_path / "run")
    damage(root / "checkpoints" / "step-00000008")
    before = _tree(root)
    with pytest.warns(UserWarning, match=r"step-00000008 is not valid \(.*" + re.escape(reason)):
        resumable = find_checkpoint("last", Location(str(root / "checkpoints")), {})
    assert resumable.info.name == "step-00000004" and resumable.info.checksums_checked
    trainer = kt.Trainer(max_steps=6, batch_size=32, default_root_dir=str(root), enable_progress_bar=False,
                         logger=False, enable_checkpointing=False)
    with pytest.warns(UserWarning, match="step-00000008 is not valid"):
        trainer.fit(Classifier(), ckpt_path="last")
    assert trainer.global_step == 6  # resumed at 4, not at the damaged 8
    assert _tree(root) == before  # nothing on disk changed


def test_a_damaged_checkpoint_named_explicitly_is_an_error_and_nothing_changes(saved, tmp_path):
    root = _copy(saved, tmp_path / "run")
    _flip_a_bit(root / "checkpoints" / "step-00000008")
    before = _tree(root)
    trainer = kt.Trainer(max_steps=9, batch_size=32, default_root_dir=str(root), enable_progress_bar=False,
                         logger=False)
    with pytest.raises(CheckpointError, match=r"step-00000008: model-00000\.\w+-\d\.tensors does not match its crc32c"):
        trainer.fit(Classifier(), ckpt_path=str(root / "checkpoints" / "step-00000008"))
    assert trainer.global_step == 0 and _tree(root) == before

