"""The TensorFlow engine: tf.distribute strategies, tf.function steps, logical CPUs, multi-worker."""

from __future__ import annotations

from ktrainer.backends.tensorflow.devices import DevicePlan, plan_devices
from ktrainer.backends.tensorflow.engine import TensorFlowEngine

__all__ = ["DevicePlan", "plan_devices", "make_engine", "is_chief_process", "TensorFlowEngine"]


def make_engine(plan: DevicePlan) -> TensorFlowEngine:
    """The TensorFlow engine for a device plan."""
    return TensorFlowEngine(plan)


def is_chief_process() -> bool:
    """The chief of a TF_CONFIG cluster (else worker 0); with no cluster, the one process."""
    return DevicePlan("cpu", (), "multi_worker").is_chief
