"""What a checkpoint holds: model and optimizer variables, progress, random state, callbacks, loggers.

Tensors go to `.tensors` shard files (a JSON index and raw bytes, see tensors.py), everything
else to JSON: loading a checkpoint never executes code.
"""

from __future__ import annotations

import io
import json
import random
import re
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ktrainer.checkpoint.tensors import read_tensors, write_tensors

__all__ = ["TrainingState", "capture", "restore", "check_compatible"]

SHARD_BYTES = 32 * 2**20  # one PUT each; measured faster on S3 than one large PUT or a multipart stream
TRAINER_FILE = "trainer.json"
MODEL_CONFIG_FILE = "model_config.json"


@dataclass
class TrainingState:
    """A snapshot of a run in host memory: what `capture` takes and `restore` puts back.

    Attributes:
        model: Model variables by key ("index:path"), as numpy arrays.
        optimizer: Optimizer variables (slots, iterations, loss-scale variables) by key.
        trainer: Progress, random state, callback and logger state, hyperparameters (JSON values).
        model_config: The Keras config of the model, when it is serializable (for export).
    """

    model: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    trainer: dict[str, Any]
    model_config: dict | None = None

    def to_files(self) -> dict[str, Any]:
        """Serialize: file name -> bytes, or a function returning the bytes (called just before writing).

        Tensors are split into shards of at most `SHARD_BYTES` (a larger variable gets a shard of
        its own): each shard is made only when it is written, so a save holds one shard at a time,
        and each is one PUT on object stores.
        """
        files: dict[str, Any] = {}
        for prefix, arrays in (("model", self.model), ("optimizer", self.optimizer)):
            for number, shard in enumerate(_shards(arrays)):
                files[f"{prefix}-{number:05d}.tensors"] = _shard_bytes(shard)
        files[TRAINER_FILE] = json.dumps(self.trainer, sort_keys=True).encode()
        if self.model_config is not None:
            files[MODEL_CONFIG_FILE] = json.dumps(self.model_config).encode()
        return files

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> TrainingState:
        """Parse the files written by `to_files`."""
        tensors: dict[str, dict[str, np.ndarray]] = {"model": {}, "optimizer": {}}
        for name in sorted(files):
            match = re.fullmatch(r"(model|optimizer)-\d{5}\.tensors", name)
            if match:
                tensors[match.group(1)].update(read_tensors(files[name]))
        config = json.loads(files[MODEL_CONFIG_FILE]) if MODEL_CONFIG_FILE in files else None
        return cls(tensors["model"], tensors["optimizer"], json.loads(files[TRAINER_FILE]), config)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data."""
        return sum(_nbytes(a) for a in [*self.model.values(), *self.optimizer.values()])


def _nbytes(value: Any) -> int:
    return int(np.prod(value.shape, dtype=np.int64)) * np.dtype(getattr(value.dtype, "name", value.dtype)).itemsize


def _shards(arrays: dict[str, Any]) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for key, value in arrays.items():
        if shards[-1] and size + _nbytes(value) > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][key] = value
        size += _nbytes(value)
    return shards


def _shard_bytes(shard: dict[str, Any]) -> Any:
    def serialize() -> bytes:
        buffer = io.BytesIO()
        write_tensors(buffer, shard)
        return buffer.getvalue()

    return serialize


def _keyed(variables: list) -> dict[str, Any]:
    return {f"{index:05d}:{variable.path}": variable for index, variable in enumerate(variables)}


def _value(variable: Any) -> np.ndarray:
    return np.asarray(variable.numpy())  # numpy() is already a snapshot: one copy, not two


def _random_state() -> dict[str, Any]:
    from keras.src.random.seed_generator import global_seed_generator

    numpy_state = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
        "tensorflow": tf.random.get_global_generator().state.numpy().tolist(),
        "keras": _value(global_seed_generator().state).tolist(),
    }


def _restore_random_state(state: dict[str, Any]) -> None:
    from keras.src.random.seed_generator import global_seed_generator

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    tf.random.get_global_generator().state.assign(np.array(state["tensorflow"], dtype=np.int64))
    generator = global_seed_generator().state
    generator.assign(np.array(state["keras"], dtype=generator.dtype))


def _model_config(model: keras.Model) -> dict | None:
    try:
        config = keras.saving.serialize_keras_object(model)
        json.dumps(config)
        return config
    except Exception:  # noqa: BLE001 - a subclassed model without get_config is fine: no export config
        return None


def capture(model: keras.Model, optimizer: Any, trainer: dict[str, Any], *, copy: bool = True) -> TrainingState:
    """Take the run's state: a copy in host memory, or references to the live variables.

    Args:
        model: The model; all its variables are saved (weights, statistics, seed-generator states).
        optimizer: The optimizer; all its variables are saved.
        trainer: The Trainer's progress and the other JSON state.
        copy: Copy every variable now (what an async save needs, and all the training loop waits
            for). Without it the variables are read one at a time while the files are written, so a
            synchronous save needs no second copy of the state in memory.
    """
    read = _value if copy else (lambda variable: variable)
    return TrainingState(
        model={key: read(v) for key, v in _keyed(model.variables).items()},
        optimizer={key: read(v) for key, v in _keyed(optimizer.variables).items()},
        trainer={**trainer, "random": _random_state()},
        model_config=_model_config(model),
    )


def _structural(key: str) -> str:
    """A variable's path without Keras's per-process numbering ("sequential_7/dense_14" -> "sequential/dense")."""
    return re.sub(r"_\d+(?=/|_|$)", "", key.split(":", 1)[1])


def check_compatible(state: TrainingState, model: keras.Model, optimizer: Any, where: str) -> None:
    """Raise before anything is loaded when the checkpoint does not fit this model and optimizer.

    Raises:
        ValueError: Listing the first mismatches (names and shapes).
    """
    problems = []
    for what, saved, variables in (("model", state.model, model.variables),
                                   ("optimizer", state.optimizer, optimizer.variables)):
        current = _keyed(variables)
        if len(saved) != len(current):
            problems.append(f"{what}: the checkpoint has {len(saved)} variables, this {what} has {len(current)}")
        for (saved_key, array), (key, variable) in zip(saved.items(), current.items(), strict=False):
            same_name = _structural(saved_key) == _structural(key)
            if not same_name or tuple(array.shape) != tuple(variable.shape):
                problems.append(f"{what} variable {key.split(':', 1)[0]}: checkpoint {saved_key.split(':', 1)[1]} "
                                f"{tuple(array.shape)} vs {key.split(':', 1)[1]} {tuple(variable.shape)}")
    if problems:
        listed = "\n  ".join(problems[:8])
        raise ValueError(f"The checkpoint {where} does not match this model and optimizer; nothing was loaded. "
                         f"First mismatches:\n  {listed}")


def restore(state: TrainingState, model: keras.Model, optimizer: Any) -> None:
    """Assign every saved variable and the random state (after `check_compatible`)."""
    for (_, array), variable in zip(state.model.items(), model.variables, strict=True):
        variable.assign(array)
    for (_, array), variable in zip(state.optimizer.items(), optimizer.variables, strict=True):
        variable.assign(array)
    _restore_random_state(state.trainer["random"])
