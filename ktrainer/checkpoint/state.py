"""What a checkpoint holds: model and optimizer variables, progress, random state, callbacks, loggers.

Tensors go to `.npz` files (read back with allow_pickle=False), everything else to JSON: loading a
checkpoint never executes code.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = ["TrainingState", "capture", "restore", "check_compatible"]

MODEL_FILE = "model.npz"
OPTIMIZER_FILE = "optimizer.npz"
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
    extra_files: dict[str, bytes] = field(default_factory=dict)

    def to_files(self) -> dict[str, bytes]:
        """Serialize to file name -> bytes."""
        files = {MODEL_FILE: _npz(self.model), OPTIMIZER_FILE: _npz(self.optimizer),
                 TRAINER_FILE: json.dumps(self.trainer, sort_keys=True).encode()}
        if self.model_config is not None:
            files[MODEL_CONFIG_FILE] = json.dumps(self.model_config).encode()
        return {**files, **self.extra_files}

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> TrainingState:
        """Parse the files written by `to_files`."""
        config = json.loads(files[MODEL_CONFIG_FILE]) if MODEL_CONFIG_FILE in files else None
        return cls(_unnpz(files[MODEL_FILE]), _unnpz(files[OPTIMIZER_FILE]), json.loads(files[TRAINER_FILE]), config)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data held."""
        return sum(a.nbytes for a in self.model.values()) + sum(a.nbytes for a in self.optimizer.values())


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _unnpz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as loaded:
        return {name: loaded[name] for name in loaded.files}


def _keyed(variables: list) -> dict[str, Any]:
    return {f"{index:05d}:{variable.path}": variable for index, variable in enumerate(variables)}


def _value(variable: Any) -> np.ndarray:
    return np.array(variable.numpy())


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


def capture(model: keras.Model, optimizer: Any, trainer: dict[str, Any]) -> TrainingState:
    """Copy the run's state to host memory (the only part of a save the training loop waits for).

    Args:
        model: The model; all its variables are saved (weights, statistics, seed-generator states).
        optimizer: The optimizer; all its variables are saved.
        trainer: The Trainer's progress and the other JSON state.
    """
    return TrainingState(
        model={key: _value(v) for key, v in _keyed(model.variables).items()},
        optimizer={key: _value(v) for key, v in _keyed(optimizer.variables).items()},
        trainer={**trainer, "random": _random_state()},
        model_config=_model_config(model),
    )


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
            if saved_key.split(":", 1)[1] != key.split(":", 1)[1] or tuple(array.shape) != tuple(variable.shape):
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
