"""What one save writes: a training state as data files, and the manifest fields that describe it.

Shared by `ModelCheckpoint` (scheduled saves, with retention) and `Trainer.save_checkpoint(path)` (one
checkpoint where the user says), so both are the same checkpoint and `ckpt_path=` resumes from either.
"""

from __future__ import annotations

import json
from typing import Any

import keras

from ktrainer.backends import backend_version
from ktrainer.checkpoint.lineage import MAX_LINEAGE
from ktrainer.checkpoint.snapshot import slice_index, to_files
from ktrainer.checkpoint.variables import read_value, start_host_copies
from ktrainer.compat.keras_internals import tensorflow_left_alone
from ktrainer.version import __version__

__all__ = ["checkpoint_payload"]


def checkpoint_payload(state: dict[str, Any], model: keras.Model, run: Any, save_id: str,
                       fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The files and manifest fields of one save.

    Args:
        state: `Trainer.state_dict()` (frozen to host memory for a background write).
        model: The module's model: its config is stored for `ktrainer ckpt export` when it has one.
        run: The run's `RunIdentity`.
        save_id: This save's id (it names the data files).
        fields: The saver's own fields (reason, metrics, monitor, owner, ...), added to the common ones.

    Returns:
        (file name -> bytes or FileSource, the manifest's fields).
    """
    config = _model_config(model)
    extra = {"model_config": config} if config is not None else None
    files = to_files(start_host_copies(state), save_id, extra_json=extra, read=read_value)
    progress = state["progress"]
    common = {"step": progress["global_step"], "epoch": progress["epoch"], "batch_in_epoch": progress["batch_in_epoch"],
              "run_id": run.run_id, "parent": run.parent, "lineage": run.lineage[-MAX_LINEAGE:], "save_id": save_id,
              "hparams": state["run"]["hparams"], "versions": _versions(),
              "global_batch_size": state["run"]["global_batch_size"], "precision": state["run"]["precision"]}
    slices = slice_index(files)
    if slices:  # a sharded state: which file holds which slice of which variable
        common["slices"] = slices
    return files, {**common, **fields}


def _versions() -> dict[str, str]:
    return {"ktrainer": __version__, "keras": keras.__version__, keras.config.backend(): backend_version()}


def _model_config(model: keras.Model) -> dict | None:
    try:
        with tensorflow_left_alone():
            config = keras.saving.serialize_keras_object(model)
        json.dumps(config)
        return config
    except Exception:  # noqa: BLE001 - a subclassed model without get_config is fine: no export config
        return None
