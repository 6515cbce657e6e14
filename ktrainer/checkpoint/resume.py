"""The Trainer's side of checkpoints: what progress it saves, where "last"/"best" are, how it resumes."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import keras
import tensorflow as tf

from ktrainer.checkpoint.manager import CheckpointError, CheckpointInfo, CheckpointManager
from ktrainer.checkpoint.state import TrainingState, capture, check_compatible, restore
from ktrainer.fs import Location

__all__ = ["capture_trainer_state", "find_checkpoint", "resume", "versions"]

log = logging.getLogger("ktrainer")


def versions() -> dict[str, str]:
    """The versions a checkpoint records."""
    import ktrainer

    return {"ktrainer": ktrainer.__version__, "keras": keras.__version__, "tensorflow": tf.__version__}


def capture_trainer_state(trainer: Any, *, copy: bool = True) -> TrainingState:
    """Take everything needed to continue this run (`copy`: see `capture`).

    At an epoch end whose data is consumed, the progress saved is "epoch + 1, batch 0", so a
    resumed run starts the next epoch; mid-epoch it is the batch reached, with the epoch's running
    metric sums, so the resumed epoch skips exactly the consumed batches and its means stay exact.
    """
    state = trainer.state
    finished_epoch = state.at_epoch_end and state.epoch_ended
    progress = {"global_step": trainer.global_step, "skipped_steps": trainer.skipped_steps,
                "epoch": trainer.current_epoch + (1 if finished_epoch else 0),
                "batch_in_epoch": 0 if finished_epoch else state.batch_in_epoch}
    epoch_metrics = None
    if not finished_epoch and state.batch_in_epoch and trainer._epoch_metrics is not None:
        epoch_metrics = trainer._epoch_metrics.state_dict()
    loggers = [{"class": type(each).__name__, "version": each.version} for each in trainer._writing_loggers()]
    module = trainer._module
    trainer_state = {
        "progress": progress, "epoch_metrics": epoch_metrics, "shuffle_seed": trainer._shuffle_seed,
        "callbacks": {callback.state_key: callback.state_dict() for callback in trainer.callbacks},
        "loggers": loggers, "hparams": _jsonable(module.hparams), "precision": trainer.precision.name,
        "global_batch_size": trainer.global_batch_size,
    }
    return capture(module.model, trainer.optimizer, trainer_state, copy=copy)


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, bool | int | float | str | type(None)) else str(v) for k, v in values.items()}


def find_checkpoint(trainer: Any, ckpt_path: str) -> tuple[CheckpointInfo, TrainingState]:
    """Resolve "last", "best" or a URI and read it, checksums verified, before anything is built.

    "last" is the newest valid checkpoint under the run's checkpoint directory (a newer invalid one
    is named in a warning and passed over); "best" the best by the monitor its manifests record.

    Raises:
        CheckpointError: When there is none, or a specific URI is invalid (nothing is modified).
    """
    if ckpt_path in ("last", "best"):
        manager = _run_checkpoints(trainer)
        listed = manager.list()
        valid = [c for c in listed if c.valid]
        for broken in [c for c in listed if not c.valid and (not valid or c.step > valid[-1].step)]:
            warnings.warn(f"Checkpoint {broken.url} is not valid ({broken.reason}); passing over it.", stacklevel=3)
        if not valid:
            raise CheckpointError(f"ckpt_path={ckpt_path!r}: no valid checkpoint under {manager.location.url}.")
        chosen = valid[-1] if ckpt_path == "last" else _best(valid, manager)
        return chosen, TrainingState.from_files(manager.read(chosen.name)[1])
    location = Location(ckpt_path.rstrip("/"), trainer.storage_options)
    parent_url, _, name = location.url.rpartition("/")
    manager = CheckpointManager(Location(parent_url or ".", trainer.storage_options))
    info, files = manager.read(name)
    return info, TrainingState.from_files(files)


def _run_checkpoints(trainer: Any) -> CheckpointManager:
    callback = trainer.checkpoint_callback
    if callback is not None and callback.manager is not None:
        return callback.manager
    return CheckpointManager(Location(f"{trainer.default_root_dir.rstrip('/')}/checkpoints", trainer.storage_options))


def _best(valid: list[CheckpointInfo], manager: CheckpointManager) -> CheckpointInfo:
    ranked = [c for c in valid if c.manifest.get("monitor") in c.manifest.get("metrics", {})]
    if not ranked:
        raise CheckpointError(f"ckpt_path='best': no checkpoint under {manager.location.url} records a monitored "
                              "metric. Give ModelCheckpoint a monitor=..., or use 'last' or a URI.")
    sign = {"min": 1.0, "max": -1.0}
    return min(ranked, key=lambda c: sign[c.manifest.get("mode", "min")] * c.manifest["metrics"][c.manifest["monitor"]])


def resume(trainer: Any, module: Any, info: CheckpointInfo, state: TrainingState) -> None:
    """Put a checkpoint's state into the built model and optimizer and the Trainer's progress.

    Raises:
        ValueError: When the checkpoint does not fit the model (nothing is loaded).
    """
    check_compatible(state, module.model, trainer.optimizer, info.url)
    restore(state, module.model, trainer.optimizer)
    saved = state.trainer
    progress = saved["progress"]
    trainer.global_step, trainer.current_epoch = progress["global_step"], progress["epoch"]
    trainer.skipped_steps = progress["skipped_steps"]
    trainer.state.batch_in_epoch = progress["batch_in_epoch"]
    trainer._resumed_epoch_metrics = saved.get("epoch_metrics")
    trainer._shuffle_seed = saved["shuffle_seed"]
    for callback in trainer.callbacks:
        if callback.state_key in saved["callbacks"]:
            callback.load_state_dict(saved["callbacks"][callback.state_key])
    for each, record in zip(trainer._writing_loggers(), saved.get("loggers", []), strict=False):
        if each._version is None and each._location is None and type(each).__name__ == record["class"]:
            each._version = record["version"]  # append to the same run
    callback = trainer.checkpoint_callback
    if callback is not None and callback.manager is not None and info.url.startswith(callback.manager.location.url):
        callback.resumed_from = info.name
    if saved.get("precision") != trainer.precision.name:
        log.warning("Resuming a %s checkpoint under precision=%r.", saved.get("precision"), trainer.precision.name)
    log.info("Resumed from %s at step %d (epoch %d, batch %d).", info.url, trainer.global_step,
             trainer.current_epoch, trainer.state.batch_in_epoch)
