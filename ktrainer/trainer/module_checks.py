"""Checks of a user's Module that catch silent mistakes before anything is built or written."""

from __future__ import annotations

import warnings
from typing import Any

import keras

from ktrainer.checks import defines_hook

__all__ = ["check_layers_created_in_build", "warn_val_data_without_validation_step",
           "check_training_steps", "check_stream_not_ended", "check_validation_stream"]


def _layers_in(value: Any) -> list[keras.layers.Layer]:
    if isinstance(value, keras.layers.Layer):
        return [value]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, keras.layers.Layer)]
    if isinstance(value, dict):
        return [item for item in value.values() if isinstance(item, keras.layers.Layer)]
    return []


def check_layers_created_in_build(module: Any) -> None:
    """A Keras model or layer found on a Module that was never built was created outside `build()`.

    Created there, it misses the precision policy (it computes in float32 under "16-mixed") and the
    strategy's scope (its variables live on one device; with `devices=2` TensorFlow fails obscurely).

    Raises:
        TypeError: Naming the attributes and saying to move them into `build()`.
    """
    if module.model is not None and module.model is module._built_model:
        return  # built by an earlier fit/validate/test: its layers are the model's
    found = [f"self.{name} ({type(layer).__name__})" for name, value in vars(module).items()
             if not name.startswith("_") for layer in _layers_in(value)]
    if found:
        name = type(module).__name__
        raise TypeError(
            f"{name} holds Keras layers created before the Trainer built it: {', '.join(found)}. Create them in "
            f"{name}.build() instead (return the model from build(); sub-layers may be assigned to self there): "
            "the Trainer sets the precision policy and enters the devices' strategy scope just before build(), so "
            "a layer made in __init__ computes in float32 under '16-mixed' and cannot be placed on several devices. "
            "A layer that only prepares data (used in train_data(), outside the model) may stay: give it a name "
            "that starts with '_', e.g. self._normalize."
        )


def warn_val_data_without_validation_step(module: Any, base: type) -> bool:
    """Warn (once per fit) when validation data is given but the Module defines no `validation_step`.

    Returns:
        True when validation can run.
    """
    if defines_hook(module, "validation_step", base):
        return True
    warnings.warn(f"Validation data was given, but {type(module).__name__} defines no validation_step(), so "
                  "validation is skipped. Define validation_step(self, batch) to validate (or pass no val_data).",
                  UserWarning, stacklevel=3)
    return False


def check_stream_not_ended(source: Any, epoch: int) -> None:
    """A generator read as one stream that ends after `epoch` full epochs: an error that says how to end the run there.

    Raises:
        ValueError: When `source` is a stream and an epoch before this one trained.
    """
    if not (source.is_stream and epoch > 0):
        return
    raise ValueError(
        f"{source.what}, a generator, ran out after {epoch} epoch{'s' if epoch != 1 else ''}: it is read as one "
        f"stream across epochs, as Keras's fit reads one. Set max_epochs={epoch} (or max_steps), set "
        "limit_train_batches=N so each epoch takes N of its batches, or give it batches for every epoch. The "
        "checkpoints of the epochs it trained are kept."
    )


def check_validation_stream(source: Any, limit_val_batches: int | float | None) -> None:
    """A generator as fit's validation data needs a batch count per validation: read once, the first validation
    would read it to its end and every later one find nothing.

    Raises:
        ValueError: When `source` is a stream and `limit_val_batches` is not an int.
    """
    if source.is_stream and not isinstance(limit_val_batches, int):
        raise ValueError(
            f"{source.what} is a generator, read as one stream: the first validation would read it to its end and "
            "every later one would find nothing. Set limit_val_batches=N (batches per validation; each takes the "
            "next N), or pass validation data that can be read again (numpy arrays, a list of batches, a "
            "PyDataset, or an object whose __iter__ starts a new pass)."
        )


def check_training_steps(batches: int | None, examples: int | None, batch_size: int, replicas: int,
                         what: str = "train_data") -> None:
    """An epoch of 0 batches trains nothing: an error naming the data size, the batch size and the replicas.

    Raises:
        ValueError: When `batches` is 0.
    """
    if batches != 0:
        return
    global_batch = batch_size * replicas
    sizes = f"global batch {global_batch} (batch_size={batch_size} per device x {replicas} " \
            f"replica{'s' if replicas != 1 else ''})"
    if examples is None:  # a dataset: found out when its first epoch yielded nothing
        raise ValueError(
            f"{what} yielded no batch in an epoch: it is empty (check filters and takes; a generator is read as "
            "one stream across epochs and had ended: give it batches for every epoch, or pass an object whose "
            "__iter__ starts a new pass), or holds fewer "
            f"examples than one {sizes}, whose last incomplete batch is dropped with several replicas. Give it "
            "data, or use a smaller batch_size or fewer devices."
        )
    raise ValueError(
        f"{what} gives 0 training batches per epoch: {examples} examples, {sizes}. With several replicas the last "
        "incomplete batch is dropped, so every replica gets the same number of examples. Use a smaller "
        "batch_size, fewer devices, or more data."
    )
