"""What the first trace of the training step shows about how the module uses its model.

While the step is traced once (to learn its outputs), the model, every model nested in it, and its
training-dependent layers (dropout, batch normalization, noise, recurrent dropout) are watched:
the dtypes of what each model called from the step itself returned (a subclassed model has no
`outputs` to read, and a step may call sub-models directly, as keras.io's VAE calls its encoder and
decoder), and the `training` value each such layer received. Nothing is watched after that trace.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import keras

from ktrainer.compat.keras_internals import flat_layers
from ktrainer.precision.report import check_output_dtype, output_dtypes
from ktrainer.utils.logs import warn_user

__all__ = ["CallRecord", "ModelOutputs", "watch_calls", "warn_if_not_training", "warn_if_outputs_not_float32"]

log = logging.getLogger("ktrainer")

_TRAINING_DEPENDENT = (keras.layers.Dropout, keras.layers.BatchNormalization, keras.layers.GaussianNoise,
                       keras.layers.GaussianDropout, keras.layers.AlphaDropout)


@dataclass
class ModelOutputs:
    """What one model called from the step (not from inside another model) returned.

    Attributes:
        model: The model called.
        dtypes: The dtypes of what it returned.
    """

    model: keras.Model
    dtypes: list[str]


@dataclass
class CallRecord:
    """What one traced step did with the model.

    Attributes:
        outputs: One entry per call of a model (the top one or a nested one) made by the step itself.
        training: (layer name, class name, the `training` it got) per call of a training-dependent layer.
    """

    outputs: list[ModelOutputs] = field(default_factory=list)
    training: list[tuple[str, str, Any]] = field(default_factory=list)


def _training_dependent(layer: keras.layers.Layer) -> bool:
    if isinstance(layer, _TRAINING_DEPENDENT):
        return True
    return isinstance(layer, keras.layers.RNN | keras.layers.LSTM | keras.layers.GRU) and (
        getattr(layer, "dropout", 0) or getattr(layer, "recurrent_dropout", 0)
        or getattr(getattr(layer, "cell", None), "dropout", 0))


@contextlib.contextmanager
def watch_calls(model: keras.Model) -> Iterator[CallRecord]:
    """Record, while the block runs (a trace), the model's output dtypes and its layers' `training` values."""
    record = CallRecord()
    patched: list[tuple[keras.layers.Layer, Any]] = []  # (layer, its own instance `call`, if it had one)
    depth = [0]  # models being called right now: only the outermost call's outputs reach the step
    try:
        for layer in [model, *flat_layers(model)]:
            if isinstance(layer, keras.Model):
                patched.append((layer, layer.__dict__.get("call")))
                layer.call = _watching_outputs(record, depth, layer, layer.call)
            elif _training_dependent(layer):
                patched.append((layer, layer.__dict__.get("call")))
                layer.call = _watching_training(record, layer, layer.call)
        yield record
    finally:
        _restore(patched)


def _watching_outputs(record: CallRecord, depth: list[int], called: keras.Model, original: Any) -> Any:
    """`original` (the model's `call`), recording in `record` the output dtypes of a call made from the step itself
    (`depth[0]` counts the model calls under way)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        try:
            outputs = original(*args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            dtypes = [keras.backend.standardize_dtype(o.dtype) for o in keras.tree.flatten(outputs)
                      if hasattr(o, "dtype")]
            record.outputs.append(ModelOutputs(called, dtypes))
        return outputs
    return call


def _watching_training(record: CallRecord, layer: keras.layers.Layer, original: Any) -> Any:
    """`original` (the layer's `call`), recording in `record` the `training` value of each call."""
    def call(*args: Any, **kwargs: Any) -> Any:
        record.training.append((layer.name, type(layer).__name__, kwargs.get("training")))
        return original(*args, **kwargs)
    return call


def _restore(patched: list[tuple[keras.layers.Layer, Any]]) -> None:
    """Give each watched layer back the `call` it had: its own instance attribute, or its class's method."""
    for layer, own in patched:
        if own is None:
            del layer.call  # the class's method again
        else:
            layer.call = own


def warn_if_not_training(record: CallRecord) -> None:
    """Warn once when a training-dependent layer ran in inference mode inside `training_step`."""
    idle = [(name, kind) for name, kind, training in record.training if training is not True]
    if idle:
        listed = ", ".join(f"{name} ({kind})" for name, kind in dict.fromkeys(idle))
        warn_user(
            f"training_step called the model without training=True, so {listed} ran as in inference (no dropout, "
            "batch statistics not updated): the model does not train as Keras's fit trains it. Fix: call "
            "self.model(x, training=True) in training_step.")


def warn_if_outputs_not_float32(record: CallRecord, model: keras.Model, precision: Any) -> None:
    """Warn, once per model, when a model the step called returned float16/bfloat16 (see `check_output_dtype`).

    `model`'s own outputs, when it is functional, were checked when it was built and are not checked again.
    """
    checked = {id(model)} if getattr(model, "outputs", None) else set()
    for called in record.outputs:
        if id(called.model) in checked:
            continue
        checked.add(id(called.model))
        whose = "the model's output" if called.model is model else f"the output of {called.model.name!r}"
        layers = output_dtypes(called.model)[1]
        check_output_dtype(called.dtypes, precision.name, precision.compute_dtype, layers, whose=whose)
