"""The Trainer and its set-up: arguments, building the model and optimizers, the learning-rate scaling,
the default callbacks and loggers, the scope around every hook, saving and the state dict, the resume
compatibility checks, the random state, tracing and the Module checks.

`Trainer` is loaded on first use, so a module of this room imports without the whole Trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ktrainer.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from ktrainer.trainer.trainer import Trainer

__all__ = ["Trainer"]

__getattr__, __dir__ = lazy_exports(__name__, {"Trainer": "ktrainer.trainer.trainer"})
