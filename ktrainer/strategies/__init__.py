"""Devices -> a tf.distribute strategy; global batch and learning-rate scaling across replicas."""

from ktrainer.strategies.lr_scaling import LR_SCALINGS, scale_learning_rate
from ktrainer.strategies.plan import DevicePlan, plan_devices

__all__ = ["DevicePlan", "plan_devices", "scale_learning_rate", "LR_SCALINGS"]
