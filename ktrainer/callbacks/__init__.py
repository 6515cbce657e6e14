"""Callbacks: the Callback base and the built-ins."""

from ktrainer.callbacks.callback import Callback
from ktrainer.callbacks.early_stopping import EarlyStopping
from ktrainer.callbacks.keras_adapter import KerasCallback
from ktrainer.callbacks.lr_monitor import LearningRateMonitor
from ktrainer.callbacks.model_checkpoint import ModelCheckpoint
from ktrainer.callbacks.progress_bar import ProgressBar
from ktrainer.callbacks.throughput import ThroughputMonitor

__all__ = ["Callback", "EarlyStopping", "KerasCallback", "LearningRateMonitor", "ModelCheckpoint", "ProgressBar",
           "ThroughputMonitor"]
