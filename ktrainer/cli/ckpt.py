"""`ktrainer ckpt ls|verify|export URI`: list, verify and export checkpoints on any fsspec storage."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from ktrainer.checkpoint.io import CheckpointError

if TYPE_CHECKING:  # the storage code loads when a command runs, not for --help
    from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
    from ktrainer.checkpoint.io import CheckpointInfo

__all__ = ["add_parser", "checkpoints_at", "branch_of_last"]


def checkpoints_at(url: str, storage_options: dict[str, Any]) -> tuple[FsspecCheckpointIO, list[str] | None]:
    """The store for URL and, when URL is one checkpoint, its name (else None: all under it).

    URL may be a checkpoint directory, a directory of checkpoints, or a run's root (its
    `checkpoints/` folder is used).
    """
    from ktrainer.checkpoint.format import MANIFEST
    from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
    from ktrainer.utils.fs import Location

    location = Location(url.rstrip("/"), storage_options)
    fs, path = location.fs, location.path
    if fs.exists(f"{path}/{MANIFEST}") or location.url.rsplit("/", 1)[-1].startswith("step-"):
        parent, _, name = location.url.rpartition("/")
        return FsspecCheckpointIO(Location(parent or ".", storage_options)), [name]
    if fs.exists(f"{path}/checkpoints"):
        location = location.join("checkpoints")
    return FsspecCheckpointIO(location), None


def branch_of_last(infos: list[CheckpointInfo], directory: str | None = None) -> set[str]:
    """The names on the branch `ckpt_path="last"` follows: the newest valid commit and its run's earlier
    checkpoints, then, through each run's parent (when it is in `directory`, a canonical URL), the checkpoints of
    the run it continued, up to where it branched off."""
    usable = [info for info in infos if info.manifest is not None]
    valid = [info for info in usable if info.valid]
    if not valid:
        return set()
    by_name = {info.name: info for info in usable}
    tip = max(valid, key=lambda info: (info.committed, info.step))
    branch: set[str] = set()
    visited: set[str] = set()
    while tip is not None and tip.fields.get("run_id") not in visited:
        run = tip.fields.get("run_id")
        visited.add(run)
        members = [i for i in usable if i.fields.get("run_id") == run and i.committed <= tip.committed]
        branch.update(i.name for i in members)
        parent = tip.fields.get("parent")
        if not isinstance(parent, str) or (directory is not None and parent.rpartition("/")[0] != directory):
            break
        tip = by_name.get(parent.rpartition("/")[2])
    return branch


def code_in_config(config: Any, uri: str) -> str | None:
    """Why exporting this model config would run Python code stored in the checkpoint, or None when it holds none.

    A `keras.layers.Lambda` keeps its function as marshalled bytecode, which runs when the model is rebuilt;
    Keras's safe mode refuses to rebuild it, and so does the export, before any of it is read.
    """
    lambdas = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("class_name") == "Lambda" and isinstance(node.get("config"), dict):
                lambdas.append(node["config"].get("name", "?"))
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(config)
    if not lambdas:
        return None
    listed = ", ".join(f"{name!r} (a keras.layers.Lambda)" for name in lambdas)
    return (f"the model config in {uri} holds Python code: layer{'s' if len(lambdas) > 1 else ''} {listed} "
            "keep their function as compiled Python, which would run while the model is rebuilt, so Keras's "
            "safe_mode refuses to rebuild it and the export does too; nothing was written. To export, rebuild "
            "the model from your own code and save it there: trainer.predict(module, x, ckpt_path=URI) loads "
            "the checkpoint's weights into module.model, then module.model.save(\"model.keras\"); or train "
            "with ModelCheckpoint(export_keras=True); or replace the Lambda with a custom layer registered with "
            "keras.saving.register_keras_serializable, whose config holds no code.")


def add_parser(commands: Any) -> None:
    """Register the `ckpt` command and its sub-commands."""
    parser = commands.add_parser("ckpt", help="list, verify or export checkpoints")
    parser.add_argument("--storage-options", type=json.loads, default={},
                        help='JSON fsspec options, e.g. \'{"client_kwargs": {"endpoint_url": "http://..."}}\'')
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", help="step, run, parent, commit time, size, valid or why not; * marks the branch "
                                       "that ckpt_path='last' follows")
    ls.add_argument("uri")
    ls.add_argument("--no-checksums", dest="checksums", action="store_false",
                    help="check sizes only (fast; the status then says 'complete', not 'valid')")
    ls.set_defaults(run=run_ls)
    verify = actions.add_parser("verify", help="check every file's size and checksum; exit 1 if any entry is invalid")
    verify.add_argument("uri")
    verify.set_defaults(run=run_verify)
    export = actions.add_parser("export", help="write a portable .keras model from a checkpoint")
    export.add_argument("uri")
    export.add_argument("output", help="the .keras file to write (local path or fsspec URL)")
    export.set_defaults(run=run_export)


def _select(args: argparse.Namespace, checksums: bool) -> tuple[list[CheckpointInfo], str]:
    io, names = checkpoints_at(args.uri, args.storage_options)
    return io.list(checksums=checksums, names=names), io.location.canonical_url


def _status(info: CheckpointInfo) -> str:
    if not info.valid:
        return f"INVALID: {info.reason}"
    return "valid" if info.checksums_checked else "complete (sizes checked)"


def _line(info: CheckpointInfo, on_branch: bool) -> str:
    fields = info.fields
    metrics = fields.get("metrics") if isinstance(fields.get("metrics"), dict) else {}
    shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())
                      if isinstance(v, int | float) and not k.startswith(("time/", "perf/", "lr-")))
    committed = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.committed)) if info.committed else "-"
    parent = fields.get("parent")
    parent_name = parent.rsplit("/", 1)[-1] if isinstance(parent, str) else "-"
    mark = "*" if on_branch else " "
    return (f"{mark} {info.name}  step {info.step}  epoch {fields.get('epoch', '?')}  run {fields.get('run_id', '-')}  "
            f"parent {parent_name}  committed {committed}  {info.size / 1e6:.2f} MB  {_status(info)}  "
            f"{shown}").rstrip()


def _print(infos: list[CheckpointInfo], directory: str) -> None:
    branch = branch_of_last(infos, directory)
    for info in sorted(infos, key=lambda i: (i.committed, i.step)):
        print(_line(info, info.name in branch))
    if branch:
        print("* the branch ckpt_path='last' follows (newest commit last)")


def run_ls(args: argparse.Namespace) -> int:
    """Print one line per checkpoint (checksums checked unless --no-checksums)."""
    infos, directory = _select(args, checksums=args.checksums)
    if not infos:
        print(f"No checkpoints at {args.uri}.")
    _print(infos, directory)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Check sizes and checksums of every file; exit 1 if any entry is invalid (or there is none)."""
    infos, directory = _select(args, checksums=True)
    _print(infos, directory)
    if not infos:
        print(f"No checkpoints at {args.uri}.")
        return 1
    return 0 if all(info.valid for info in infos) else 1


def run_export(args: argparse.Namespace) -> int:
    """Rebuild the model from the checkpoint's config, load its weights, save a .keras file."""
    import keras
    import numpy as np

    from ktrainer.checkpoint.slices import ranged_files
    from ktrainer.checkpoint.snapshot import from_files
    from ktrainer.compat.keras_internals import tensorflow_left_alone
    from ktrainer.utils.fs import Location

    io, names = checkpoints_at(args.uri, args.storage_options)
    if names is None:
        valid = [c for c in io.list() if c.valid]
        if not valid:
            raise CheckpointError(f"No valid checkpoint at {args.uri}.")
        names = [max(valid, key=lambda c: (c.committed, c.step)).name]
    info, files = io.read(names[0])
    state, extra = from_files(files, ranged_files(info.manifest.fields))
    config = extra.get("model_config")
    if config is None:
        raise ValueError(f"{args.uri} holds no model config (a subclassed model without get_config); export it "
                         "from Python with model.save() after loading, or use ModelCheckpoint(export_keras=True).")
    refusal = code_in_config(config, args.uri)
    if refusal:
        print(f"ktrainer ckpt export: refused: {refusal}", file=sys.stderr)
        return 1
    with tensorflow_left_alone():  # on JAX, Keras would import TensorFlow to check types no object here has
        model = keras.saving.deserialize_keras_object(config)
    for variable, array in zip(model.variables, state["model"].values(), strict=True):
        variable.assign(np.asarray(array))
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, "model.keras")
        with tensorflow_left_alone():
            model.save(local)
        target = Location(args.output, args.storage_options)
        parent, _, name = target.url.rpartition("/")
        Location(parent or ".", args.storage_options).upload(local, name)
    print(f"Exported {io.url}/{names[0]} to {args.output}.")
    return 0
