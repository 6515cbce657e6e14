"""Precision plugins, chosen by the Trainer's `precision` string."""

from __future__ import annotations

from ktrainer.errors import check_choice
from ktrainer.precision.base import Precision

__all__ = ["Precision", "resolve_precision", "SUPPORTED"]

_ALIASES = {"32": "32-true", 32: "32-true"}
SUPPORTED = ("32-true", "32")


def resolve_precision(value: str | int | Precision) -> Precision:
    """Return the plugin for a `precision` argument.

    Args:
        value: A precision string (see `SUPPORTED`) or a `Precision` instance.

    Returns:
        A `Precision` plugin.

    Raises:
        ValueError: For an unsupported value, listing the supported ones.
    """
    if isinstance(value, Precision):
        return value
    check_choice("precision", value, SUPPORTED)
    return Precision(_ALIASES.get(value, value))
