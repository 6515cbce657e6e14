"""What the first trace of the training step shows about how the module uses its model.

While the step is traced once (to learn its outputs), the model's top-level call and its
training-dependent layers (dropout, batch normalization, noise, recurrent dropout) are watched:
the dtype of the model's actual outputs (a subclassed model has no `outputs` to read), and the
`training` value each such layer received. Nothing is watched after that trace.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import keras

from ktrainer.compat.keras_internals import flat_layers

__all__ = ["CallRecord", "watch_calls", "warn_if_not_training"]

log = logging.getLogger("ktrainer")

_TRAINING_DEPENDENT = (keras.layers.Dropout, keras.layers.BatchNormalization, keras.layers.GaussianNoise,
                       keras.layers.GaussianDropout, keras.layers.AlphaDropout)


@dataclass
class CallRecord:
    """What one traced step did with the model.

    Attributes:
        output_dtypes: The dtypes of the model's outputs, in its top-level calls.
        training: (layer name, class name, the `training` it got) per call of a training-dependent layer.
    """

    output_dtypes: list[str] = field(default_factory=list)
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

    def watch_outputs(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            outputs = original(*args, **kwargs)
            record.output_dtypes.extend(keras.backend.standardize_dtype(o.dtype) for o in keras.tree.flatten(outputs)
                                        if hasattr(o, "dtype"))
            return outputs
        return call

    def watch_training(layer: keras.layers.Layer, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            record.training.append((layer.name, type(layer).__name__, kwargs.get("training")))
            return original(*args, **kwargs)
        return call

    try:
        patched.append((model, model.__dict__.get("call")))
        model.call = watch_outputs(model.call)
        for layer in flat_layers(model):
            if _training_dependent(layer):
                patched.append((layer, layer.__dict__.get("call")))
                layer.call = watch_training(layer, layer.call)
        yield record
    finally:
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
        warnings.warn(
            f"training_step called the model without training=True, so {listed} ran as in inference (no dropout, "
            "batch statistics not updated): the model does not train as Keras's fit trains it. Fix: call "
            "self.model(x, training=True) in training_step.",
            UserWarning,
            stacklevel=3,
        )
