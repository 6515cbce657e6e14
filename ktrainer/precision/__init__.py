"""Precision plugins, chosen by the Trainer's `precision` string."""

from __future__ import annotations

from ktrainer.checks import check_choice
from ktrainer.precision.base import Precision
from ktrainer.precision.mixed import MixedPrecision, TrainingStalledError
from ktrainer.precision.report import LayerPrecision
from ktrainer.precision.true import TruePrecision

__all__ = ["Precision", "MixedPrecision", "TruePrecision", "TrainingStalledError", "LayerPrecision",
           "resolve_precision", "SUPPORTED"]

_ALIASES = {"32": "32-true", 32: "32-true", "64": "64-true", 64: "64-true"}
SUPPORTED = ("32-true", "32", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true", "64")


def resolve_precision(value: str | int | Precision) -> Precision:
    """Return the plugin for a `precision` argument.

    Args:
        value: A precision string (see `SUPPORTED`) or a `Precision` instance (e.g.
            `MixedPrecision("16-mixed", initial_scale=2**10)`).

    Returns:
        A `Precision` plugin.

    Raises:
        ValueError: For an unsupported value, listing the supported ones.
    """
    if isinstance(value, Precision):
        return value
    check_choice("precision", value, SUPPORTED)
    name = _ALIASES.get(value, value)
    if name.endswith("-mixed"):
        return MixedPrecision(name)
    if name == "32-true":
        return Precision(name)
    return TruePrecision(name)
