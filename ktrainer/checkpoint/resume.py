"""Which checkpoint a `ckpt_path` means: "last", "best" or a URI, verified before it is chosen.

"last" is the most recently committed checkpoint of the run's checkpoint directory (so after
resuming from an older checkpoint, "last" follows the new branch), "best" the best by the
monitor its manifests record. Every checksum of a candidate is checked before it is chosen; a
candidate that fails is named in a warning and the next one is taken, with nothing on disk
changed. A specific URI that fails is an error.
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass
from typing import Any

from ktrainer.checkpoint.format import MANIFEST
from ktrainer.checkpoint.format1 import upgrade
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError, CheckpointInfo
from ktrainer.checkpoint.slices import ranged_files
from ktrainer.checkpoint.snapshot import from_files
from ktrainer.checkpoint.variables import assign_all, mismatches, refuse_mismatches
from ktrainer.utils.fs import Location
from ktrainer.utils.logs import warn_user

__all__ = ["ALIASES", "Resumable", "check_ckpt_path", "find_checkpoint", "load_model_weights", "split_checkpoint_url"]

log = logging.getLogger("ktrainer")

ALIASES = ("last", "best")


@dataclass
class Resumable:
    """A checkpoint chosen and read, ready to be loaded.

    Attributes:
        info: The checkpoint (checksums checked).
        state: Its state, as `Trainer.state_dict()` returned it (arrays as numpy).
        canonical_url: Its URL, canonical, symbolic links resolved (what manifests record as a
            run's parent, and retention compares).
    """

    info: CheckpointInfo
    state: dict[str, Any]
    canonical_url: str


def check_ckpt_path(ckpt_path: Any) -> str | None:
    """Check a `ckpt_path` argument before anything is built: None, "last", "best", or a path/URI.

    Raises:
        ValueError: For another type, an empty string, or a near-miss of an alias that names no
            existing path (suggesting the alias).
    """
    if ckpt_path is None:
        return None
    if isinstance(ckpt_path, os.PathLike):
        ckpt_path = os.fspath(ckpt_path)
    if not isinstance(ckpt_path, str) or not ckpt_path:
        raise ValueError(f"ckpt_path must be 'last', 'best', a checkpoint path or URI, or None; got {ckpt_path!r} "
                         f"({type(ckpt_path).__name__}).")
    if ckpt_path in ALIASES or "://" in ckpt_path or os.path.exists(ckpt_path):
        return ckpt_path
    close = difflib.get_close_matches(ckpt_path.lower(), ALIASES, n=1, cutoff=0.5)
    if close:
        raise ValueError(f"ckpt_path={ckpt_path!r} is neither 'last' nor 'best' nor an existing path. Did you mean "
                         f"ckpt_path={close[0]!r}?")
    return ckpt_path


def split_checkpoint_url(url: str, storage_options: dict[str, Any]) -> tuple[Location, str]:
    """(the directory holding it, its name) of one checkpoint's URL."""
    location = Location(url.rstrip("/"), storage_options)
    parent, _, name = location.url.rpartition("/")
    return Location(parent or ".", storage_options), name


def find_checkpoint(ckpt_path: str, checkpoint_dir: Location, storage_options: dict[str, Any]) -> Resumable | None:
    """Resolve and read the checkpoint `ckpt_path` names, every checksum checked.

    Args:
        ckpt_path: "last", "best", or a checkpoint's path or URI.
        checkpoint_dir: Where "last" and "best" look (the run's checkpoint directory).
        storage_options: fsspec options for a URI.

    Returns:
        The checkpoint; None for "last" when the directory holds no checkpoint at all (what that
        means is the caller's: fit starts a new run, validate/test refuse).

    Raises:
        CheckpointError: When no checkpoint there is valid, a newer ktrainer wrote one there, or a
            specific URI is invalid or of a newer format (nothing is modified).
    """
    if ckpt_path in ALIASES:
        io = FsspecCheckpointIO(checkpoint_dir)
        chosen = _choose(io, ckpt_path)
        if chosen is None:
            return None
        info, files = chosen
        directory = checkpoint_dir
    else:
        directory, name = split_checkpoint_url(ckpt_path, storage_options)
        io = FsspecCheckpointIO(directory)
        if not directory.join(name, MANIFEST).exists():
            _refuse_a_folder_of_checkpoints(ckpt_path, directory.join(name))
        try:
            info, files = io.read(name, arrays=True)
        except CheckpointError as error:
            raise CheckpointError(f"{error}{_in_checkpoint_dir(ckpt_path, checkpoint_dir)}") from None
    try:
        state, _ = upgrade(files) if info.manifest.format_version == 1 else \
            from_files(files, ranged_files(info.manifest.fields))
    except (ValueError, KeyError) as error:
        raise CheckpointError(f"{info.url} cannot be read: {error}.") from None
    return Resumable(info, state, directory.join(info.name).canonical_url)


def load_model_weights(ckpt_path: str, checkpoint_dir: Location, storage_options: dict[str, Any],
                       model: Any) -> None:
    """Assign the model weights of the checkpoint `ckpt_path` names to `model` (for validate/test: the optimizer
    and the run are not touched), every variable checked before any is assigned.

    Raises:
        ValueError: When there is no checkpoint yet, or its variables do not fit the model (nothing is assigned).
        CheckpointError: As `find_checkpoint`.
    """
    resumed = find_checkpoint(ckpt_path, checkpoint_dir, storage_options)
    if resumed is None:
        raise ValueError(f"ckpt_path={ckpt_path!r}: there is no checkpoint under {checkpoint_dir.url} yet. Train "
                         "with this default_root_dir first, or pass a checkpoint's path or URI.")
    refuse_mismatches(mismatches("model", resumed.state["model"], model.variables), "this model")
    assign_all(resumed.state["model"], model.variables)
    log.info("Evaluating the weights of %s (step %d).", resumed.info.url, resumed.state["progress"]["global_step"])


def _refuse_a_folder_of_checkpoints(ckpt_path: str, folder: Location) -> None:
    """A run's folder, or its checkpoints folder, given where one checkpoint is wanted: say what to pass instead."""
    if folder.join("checkpoints").exists():
        raise CheckpointError(f"ckpt_path={ckpt_path!r} is a run's folder, not a checkpoint. Pass "
                              f"ckpt_path='last' with this run's default_root_dir, or one of its checkpoints "
                              f"({ckpt_path.rstrip('/')}/checkpoints/step-...).")
    try:
        held = [info.name for info in FsspecCheckpointIO(folder).list() if info.valid]
    except OSError:
        return
    if held:
        raise CheckpointError(f"ckpt_path={ckpt_path!r} is a folder of checkpoints, not one checkpoint. Pass one "
                              f"of them (the newest: {ckpt_path.rstrip('/')}/{held[-1]}), or ckpt_path='last' with "
                              "a ModelCheckpoint whose dirpath is this folder.")


def _in_checkpoint_dir(ckpt_path: str, checkpoint_dir: Location) -> str:
    """A hint when a bare name (as `ktrainer ckpt ls` prints it) names a checkpoint of the run's directory."""
    name = str(ckpt_path).rstrip("/")
    if "/" in name or os.sep in name:
        return ""
    candidate = checkpoint_dir.join(name)
    if not candidate.join(MANIFEST).exists():
        return ""
    return f" This run's checkpoint directory has one of that name: pass ckpt_path={candidate.url!r}."


def _choose(io: FsspecCheckpointIO, alias: str) -> tuple[CheckpointInfo, dict[str, Any]] | None:
    listed = io.list()
    if not listed and alias == "last":
        return None
    newer = [info for info in listed if info.newer_format is not None]
    if newer:
        raise CheckpointError(f"ckpt_path={alias!r}: {newer[-1].url} (and {len(newer) - 1} more) was written by a "
                              f"newer ktrainer (checkpoint format {newer[-1].newer_format}); which checkpoint is the "
                              "latest cannot be told without it. Upgrade ktrainer, or pass the URI of one checkpoint.")
    candidates = [info for info in listed if info.manifest is not None]
    if alias == "last":
        candidates.sort(key=lambda info: (info.committed, info.step), reverse=True)
    else:
        candidates = _ranked(candidates, io)
    chosen = None
    for info in candidates:
        if not info.valid:
            _pass_over(info.url, info.reason)
            continue
        try:
            chosen = io.read(info.name, arrays=True)
            break
        except CheckpointError as error:
            _pass_over(info.url, str(error))
    newest_step = chosen[0].step if chosen else -1
    for info in listed:  # entries without a usable manifest, newer than the one chosen: say why they are skipped
        if info.manifest is None and info.step > newest_step:
            _pass_over(info.url, info.reason)
    if chosen is not None:
        return chosen
    raise CheckpointError(f"ckpt_path={alias!r}: no valid checkpoint under {io.url} (the warnings above say why "
                          "each is not). `ktrainer ckpt ls` lists them; pass one that is valid, or fit without "
                          "ckpt_path to start over.")


def _ranked(candidates: list[CheckpointInfo], io: FsspecCheckpointIO) -> list[CheckpointInfo]:
    ranked = []
    for info in candidates:
        fields = info.fields
        metrics, monitor = fields.get("metrics"), fields.get("monitor")
        if isinstance(metrics, dict) and isinstance(metrics.get(monitor), int | float):
            sign = -1.0 if fields.get("mode") == "max" else 1.0
            ranked.append((sign * metrics[monitor], info.committed, info))  # a tie: the first to reach it
    if not ranked:
        raise CheckpointError(f"ckpt_path='best': no checkpoint under {io.url} records a monitored metric. Give "
                              "ModelCheckpoint a monitor=..., or use 'last' or a URI.")
    return [info for *_, info in sorted(ranked, key=lambda item: item[:2])]


def _pass_over(url: str, reason: str) -> None:
    warn_user(f"Checkpoint {url} is not valid ({reason}); passing over it.")
