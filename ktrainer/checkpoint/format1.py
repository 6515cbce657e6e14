"""Checkpoints of format 1 (ktrainer 0.1.0), read into the state that `Trainer.load_state_dict` takes.

Format 1 kept its files under fixed names (`model-00000.tensors`, `trainer.json`, ...), the
progress and the shuffle seed apart, callbacks keyed by class name and loggers as a list. Those
keys are matched to this run's components by class when the class is unambiguous.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ktrainer.checkpoint.tensors import read_tensors

__all__ = ["upgrade"]

_TENSORS = re.compile(r"(model|optimizer)-[0-9]{5}\.tensors")


def upgrade(files: dict[str, bytes]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, extra JSON files) of a format-1 checkpoint's files.

    Raises:
        ValueError: When a file is missing or malformed.
    """
    tensors: dict[str, dict[str, Any]] = {"model": {}, "optimizer": {}}
    for name in sorted(files):
        match = _TENSORS.fullmatch(name)
        if match:
            tensors[match.group(1)].update(read_tensors(files[name]))
    if "trainer.json" not in files:
        raise ValueError("the format-1 checkpoint has no trainer.json")
    old = json.loads(files["trainer.json"])
    progress = {**old["progress"], "shuffle_seed": old["shuffle_seed"], "epoch_sums": old.get("epoch_metrics"),
                "pending_validation": False}
    state = {
        "model": tensors["model"], "optimizer": tensors["optimizer"], "accumulation": {}, "progress": progress,
        "random": old["random"], "callbacks": dict(old.get("callbacks", {})),
        "loggers": {entry["class"]: {"version": entry["version"]} for entry in old.get("loggers", [])},
        "precision": {},
        "run": {"run_id": None, "lineage": [], "parent": None, "global_batch_size": old["global_batch_size"],
                "precision": old["precision"], "hparams": old.get("hparams", {})},
    }
    extra = {"model_config": json.loads(files["model_config.json"])} if "model_config.json" in files else {}
    return state, extra
