"""`ktrainer ckpt ls|verify|export URI`: list, verify and export checkpoints on any fsspec storage."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

from ktrainer.checkpoint.manager import MANIFEST, CheckpointInfo, CheckpointManager
from ktrainer.fs import Location

__all__ = ["add_parser", "checkpoints_at"]


def checkpoints_at(url: str, storage_options: dict[str, Any]) -> tuple[CheckpointManager, list[str] | None]:
    """The manager for URL and, when URL is one checkpoint, its name (else None: all under it).

    URL may be a checkpoint directory, a directory of checkpoints, or a run's root (its
    `checkpoints/` folder is used).
    """
    location = Location(url.rstrip("/"), storage_options)
    fs, path = location.fs, location.path
    if fs.exists(f"{path}/{MANIFEST}") or location.url.rsplit("/", 1)[-1].startswith("step-"):
        parent, _, name = location.url.rpartition("/")
        return CheckpointManager(Location(parent, storage_options)), [name]
    if fs.exists(f"{path}/checkpoints"):
        location = location.join("checkpoints")
    return CheckpointManager(location), None


def add_parser(commands: Any) -> None:
    """Register the `ckpt` command and its sub-commands."""
    parser = commands.add_parser("ckpt", help="list, verify or export checkpoints")
    parser.add_argument("--storage-options", type=json.loads, default={},
                        help='JSON fsspec options, e.g. \'{"client_kwargs": {"endpoint_url": "http://..."}}\'')
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", help="step, epoch, metrics, size, valid or why not")
    ls.add_argument("uri")
    ls.set_defaults(run=run_ls)
    verify = actions.add_parser("verify", help="check every file's size and checksum; exit 1 if any is invalid")
    verify.add_argument("uri")
    verify.set_defaults(run=run_verify)
    export = actions.add_parser("export", help="write a portable .keras model from a checkpoint")
    export.add_argument("uri")
    export.add_argument("output", help="the .keras file to write (local path or fsspec URL)")
    export.set_defaults(run=run_export)


def _select(args: argparse.Namespace, checksums: bool) -> list[CheckpointInfo]:
    manager, names = checkpoints_at(args.uri, args.storage_options)
    if names is None:
        return manager.list(checksums=checksums)
    return [manager.inspect(name, checksums=checksums) for name in names]


def _line(info: CheckpointInfo) -> str:
    manifest = info.manifest
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(manifest.get("metrics", {}).items())
                        if not k.startswith(("time/", "lr-")))
    status = "valid" if info.valid else f"INVALID: {info.reason}"
    epoch = manifest.get("epoch", "?")
    return f"{info.name}  step {info.step}  epoch {epoch}  {info.size / 1e6:.2f} MB  {status}  {metrics}".rstrip()


def run_ls(args: argparse.Namespace) -> int:
    """Print one line per checkpoint."""
    infos = _select(args, checksums=False)
    if not infos:
        print(f"No checkpoints at {args.uri}.")
    for info in infos:
        print(_line(info))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Check sizes and checksums of every file; exit 1 if any checkpoint is invalid."""
    infos = _select(args, checksums=True)
    for info in infos:
        print(_line(info))
    if not infos:
        print(f"No checkpoints at {args.uri}.")
        return 1
    return 0 if all(info.valid for info in infos) else 1


def run_export(args: argparse.Namespace) -> int:
    """Rebuild the model from the checkpoint's config, load its weights, save a .keras file."""
    import keras
    import numpy as np

    from ktrainer.checkpoint.state import TrainingState

    manager, names = checkpoints_at(args.uri, args.storage_options)
    if names is None:
        valid = [c for c in manager.list() if c.valid]
        if not valid:
            raise ValueError(f"No valid checkpoint at {args.uri}.")
        names = [valid[-1].name]
    _, files = manager.read(names[0])
    state = TrainingState.from_files(files)
    if state.model_config is None:
        raise ValueError(f"{args.uri} holds no model config (a subclassed model without get_config); export it "
                         "from Python with model.save() after loading, or use ModelCheckpoint(export_keras=True).")
    model = keras.saving.deserialize_keras_object(state.model_config)
    for variable, (_, array) in zip(model.variables, state.model.items(), strict=True):
        variable.assign(np.asarray(array))
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, "model.keras")
        model.save(local)
        target = Location(args.output, args.storage_options)
        parent, _, name = target.url.rpartition("/")
        Location(parent or ".", args.storage_options).upload(local, name)
    print(f"Exported {manager.location.url}/{names[0]} to {args.output}.")
    return 0
