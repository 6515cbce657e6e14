"""Train a Keras example with model.fit and its port to a Module from the same start, on the same data; compare.

A case gives `build()` (the example's model), what `compile` gets, and the Module the user would
write (its `build` is given the reference's initial weights). Data are unshuffled on both sides
(`shuffle=False`), so both see the same batches in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

import ktrainer as kt

__all__ = ["Run", "fit_both", "assert_same_weights", "assert_same_epoch_losses", "from_weights"]


@dataclass
class Run:
    """Both sides of one comparison."""

    keras_model: keras.Model
    keras_history: dict[str, list[float]]
    module: kt.Module
    trainer: kt.Trainer
    history: dict[str, list[float]]
    extra: dict[str, Any] = field(default_factory=dict)


def from_weights(module_class: type, values: list[np.ndarray]) -> type:
    """`module_class` whose model starts from the reference's initial variables (weights and the state of its
    seed generators, so dropout draws the same masks); its own `build` runs as written."""

    class Ported(module_class):
        def build(self) -> keras.Model:
            model = super().build()
            for variable, value in zip(model.variables, values, strict=True):
                variable.assign(value)
            return model

    Ported.__name__ = module_class.__name__
    return Ported


def fit_both(build: Callable[[], keras.Model], module_class: type, compile_args: dict, x: Any, y: Any = None, *,
             epochs: int = 2, batch_size: int = 16, fit_args: dict | None = None, trainer_args: dict | None = None,
             train_data: Any = None, val_data: Any = None, module_args: dict | None = None,
             our_fit_args: dict | None = None, fit_optimizer: Callable[[], Any] | None = None) -> Run:
    """model.fit the example, then trainer.fit its port from the same initial weights.

    Args:
        build: The example's model.
        module_class: The Module the user writes (its `build` is replaced to start from the same weights).
        compile_args: What `model.compile` gets (optimizer, loss, metrics, loss_weights, ...): the
            optimizer is given as a function of no arguments, so each side gets its own.
        x: Keras's `x`.
        y: Keras's `y`.
        epochs: Epochs on both sides.
        batch_size: Batch size on both sides.
        fit_args: More `model.fit` arguments (sample_weight, validation_data, callbacks).
        trainer_args: More Trainer arguments.
        train_data: ktrainer's training data; default `(x, y)` (or `x`).
        val_data: ktrainer's validation data.
        module_args: The Module's constructor arguments.
        our_fit_args: More `trainer.fit` arguments (validation_split).
        fit_optimizer: The optimizer `model.fit` gets where it must differ from the Module's (a function of
            no arguments); default compile_args's.
    """
    keras.utils.set_random_seed(0)
    model = build()
    initial = [keras.ops.convert_to_numpy(v) for v in model.variables]
    arguments = dict(compile_args)
    arguments["optimizer"] = (fit_optimizer or arguments["optimizer"])()
    model.compile(**arguments)
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, **(fit_args or {}))
    module = from_weights(module_class, initial)(**(module_args or {}))
    module.make_optimizer = compile_args["optimizer"]
    trainer = kt.Trainer(max_epochs=epochs, batch_size=batch_size, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, **(trainer_args or {}))
    if train_data is None:
        train_data = x if y is None else (x, y)
    ours = trainer.fit(module, train_data=train_data, val_data=val_data, shuffle=False, **(our_fit_args or {}))
    return Run(model, history.history, module, trainer, ours.history)


def assert_same_weights(run: Run, atol: float = 1e-5) -> None:
    """The final weights of both sides, within `atol`."""
    theirs = run.keras_model.get_weights()
    ours = run.module.model.get_weights()
    assert len(theirs) == len(ours)
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=f"weight {index}")


def assert_same_epoch_losses(run: Run, ours: str = "train/loss_epoch", theirs: str = "loss",
                             atol: float = 1e-5) -> None:
    """Every epoch's mean loss of both sides, within `atol`."""
    np.testing.assert_allclose(run.history[ours], run.keras_history[theirs], rtol=0, atol=atol)
