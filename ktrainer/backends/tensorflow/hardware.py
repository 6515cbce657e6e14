"""TensorFlow: what accelerators this process sees (kinds and GPU compute capabilities)."""

from __future__ import annotations

import tensorflow as tf

from ktrainer.backends.accelerators import Accelerators

__all__ = ["visible_accelerators"]


def visible_accelerators() -> Accelerators:
    """Read the GPUs (with compute capability) and TPUs TensorFlow can see. Does not initialize devices."""
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        gpus.append(tuple(details.get("compute_capability", (0, 0))))
    return Accelerators(gpus=tuple(gpus), tpus=len(tf.config.list_physical_devices("TPU")))
