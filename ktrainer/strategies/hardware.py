"""What accelerators this process sees: kinds and GPU compute capabilities."""

from __future__ import annotations

from dataclasses import dataclass, field

import tensorflow as tf

__all__ = ["Accelerators", "visible_accelerators"]


@dataclass(frozen=True)
class Accelerators:
    """The accelerators visible to TensorFlow.

    Attributes:
        gpus: Compute capability of each GPU as (major, minor); (0, 0) when unknown.
        tpus: Number of TPU devices.
    """

    gpus: tuple[tuple[int, int], ...] = field(default_factory=tuple)
    tpus: int = 0


def visible_accelerators() -> Accelerators:
    """Read the GPUs (with compute capability) and TPUs TensorFlow can see. Does not initialize devices."""
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        gpus.append(tuple(details.get("compute_capability", (0, 0))))
    return Accelerators(gpus=tuple(gpus), tpus=len(tf.config.list_physical_devices("TPU")))
