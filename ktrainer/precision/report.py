"""What precision each layer really runs in, float32 overrides, and the output-layer check."""

from __future__ import annotations

import logging
from typing import NamedTuple

import keras

from ktrainer.compat.keras_internals import flat_layers, producing_layer_name
from ktrainer.utils.logs import warn_user

__all__ = ["LayerPrecision", "precision_report", "output_dtypes", "check_output_dtype", "summarize"]

log = logging.getLogger("ktrainer")


class LayerPrecision(NamedTuple):
    """One row of `Trainer.precision_report()`.

    Attributes:
        class_name: The layer's class, e.g. "Dense".
        compute_dtype: The dtype it computes in.
        variable_dtype: The dtype of its variables.
    """

    class_name: str
    compute_dtype: str
    variable_dtype: str


def _layers(model: keras.Model) -> list[keras.layers.Layer]:
    layers = flat_layers(model)
    return [layer for layer in layers if not isinstance(layer, keras.layers.InputLayer)]


def precision_report(model: keras.Model) -> dict[str, LayerPrecision]:
    """Compute and variable dtype of every layer (nested ones included), by layer name, in model order."""
    return {layer.name: LayerPrecision(type(layer).__name__, layer.compute_dtype, layer.variable_dtype)
            for layer in _layers(model)}


def output_dtypes(model: keras.Model) -> tuple[list[str], list[str]]:
    """The dtypes of a functional model's outputs, and the names of the layers that make those not float32
    (both empty for a subclassed model: see `tracing.watch_calls`, which records what its calls return)."""
    outputs = getattr(model, "outputs", None)
    if not outputs:
        return [], []
    tensors = keras.tree.flatten(outputs)
    dtypes = [keras.backend.standardize_dtype(t.dtype) for t in tensors]
    layers = []
    for tensor, dtype in zip(tensors, dtypes, strict=True):
        name = producing_layer_name(tensor)
        if dtype != "float32" and name is not None and name not in layers:
            layers.append(name)
    return dtypes, layers


def check_output_dtype(dtypes: list[str], precision_name: str, compute_dtype: str,
                       layers: list[str] | None = None, whose: str = "the model's output") -> None:
    """Warn, with the exact fix, when a float16/bfloat16 model's output is not float32.

    Args:
        dtypes: The dtypes of the model's actual outputs.
        precision_name: The precision, for the message.
        compute_dtype: The policy's compute dtype.
        layers: The layers making the outputs that are not float32, when known.
        whose: What the outputs are, for the message ("the output of 'decoder'" for a sub-model).
    """
    if compute_dtype not in ("float16", "bfloat16") or not dtypes or all(d == "float32" for d in dtypes):
        return
    if layers:
        which = f"layer{'s' if len(layers) > 1 else ''} {', '.join(repr(name) for name in layers)}"
    else:
        which = "the layer that makes the model's output"
    warn_user(
        f"precision={precision_name!r}: {whose} is {', '.join(sorted(set(dtypes)))}, not float32. "
        f"Softmax and the loss need float32's range and precision. Fix: create {which} with dtype=\"float32\", "
        f"e.g. keras.layers.Dense(..., dtype=\"float32\").")


def summarize(report: dict[str, LayerPrecision], precision_name: str, policy: str) -> str:
    """One line: the policy and how many layers compute in which dtype."""
    by_dtype: dict[str, list[str]] = {}
    for name, row in report.items():
        by_dtype.setdefault(f"{row.compute_dtype}/{row.variable_dtype}", []).append(name)
    parts = []
    for dtypes, names in sorted(by_dtype.items(), key=lambda item: -len(item[1])):
        listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{len(names)} layer{'s' if len(names) != 1 else ''} {dtypes} ({listed})")
    return f"precision={precision_name!r} (policy {policy}), compute/variable dtypes: " + "; ".join(parts)


def log_report(report: dict[str, LayerPrecision], precision_name: str, policy: str) -> None:
    """Log the summary line at info level and the full table at debug level."""
    log.info(summarize(report, precision_name, policy))
    if log.isEnabledFor(logging.DEBUG):
        width = max((len(name) for name in report), default=5)
        lines = [f"{'layer':<{width}}  {'class':<20} compute   variable"]
        for name, row in report.items():
            lines.append(f"{name:<{width}}  {row.class_name:<20} {row.compute_dtype:<9} {row.variable_dtype}")
        log.debug("\n".join(lines))
