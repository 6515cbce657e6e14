"""Devices -> a tf.distribute strategy."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ktrainer.errors import check_choice

__all__ = ["resolve_strategy"]


def resolve_strategy(devices: Any) -> tf.distribute.Strategy:
    """Return the strategy that runs the module on `devices`.

    Args:
        devices: The Trainer's `devices` argument; 1 (or "auto") for now.

    Returns:
        TensorFlow's default strategy (one device).

    Raises:
        ValueError: For any other value, naming what is supported.
    """
    check_choice("devices", devices, (1, "auto"))
    return tf.distribute.get_strategy()
