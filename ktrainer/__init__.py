"""ktrainer: a Trainer for Keras 3 that does the engineering (precision, devices, logging, checkpoints).

The public names are loaded on first use: `import ktrainer` stays cheap, so the command line's
`--help` answers at once; Keras (and TensorFlow with it) is imported when the first of them is
touched, e.g. `ktrainer.Trainer`.
"""

from __future__ import annotations

import os
import sys
import types
from typing import TYPE_CHECKING, Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if TYPE_CHECKING:
    from ktrainer import callbacks, loggers, precision
    from ktrainer.compare_precision import PrecisionComparison, compare_precision
    from ktrainer.loop.preemption import Preempted
    from ktrainer.module import Module
    from ktrainer.trainer.trainer import Trainer

from ktrainer.utils.lazy import lazy_exports
from ktrainer.version import __version__

__all__ = ["Trainer", "Module", "Preempted", "callbacks", "loggers", "precision", "compare_precision",
           "PrecisionComparison", "__version__"]


def _check_keras_backend() -> None:
    from ktrainer.backends import backend_name

    backend_name()


__getattr__, __dir__ = lazy_exports(__name__, {
    "Trainer": "ktrainer.trainer.trainer",
    "Module": "ktrainer.module",
    "Preempted": "ktrainer.loop.preemption",
    "compare_precision": "ktrainer.compare_precision",
    "PrecisionComparison": "ktrainer.compare_precision",
    "callbacks": "ktrainer.callbacks",
    "loggers": "ktrainer.loggers",
    "precision": "ktrainer.precision",
}, before_load=_check_keras_backend)


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # Importing the submodule `ktrainer.compare_precision` would otherwise replace the function
        # `ktrainer.compare_precision` (the public name) with that module.
        if name == "compare_precision" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
