"""ktrainer: a Trainer for Keras 3 that does the engineering (precision, devices, logging, checkpoints)."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

if keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"ktrainer runs Keras on the TensorFlow backend, but Keras was started with the "
        f"{keras.backend.backend()!r} backend. Set KERAS_BACKEND=tensorflow before importing keras."
    )

from ktrainer import callbacks, loggers, precision  # noqa: E402
from ktrainer.compare_precision import PrecisionComparison, compare_precision  # noqa: E402
from ktrainer.module import Module  # noqa: E402
from ktrainer.preemption import Preempted  # noqa: E402
from ktrainer.trainer import Trainer  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Trainer", "Module", "Preempted", "callbacks", "loggers", "precision", "compare_precision",
           "PrecisionComparison", "__version__"]
