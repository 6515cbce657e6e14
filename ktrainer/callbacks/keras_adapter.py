"""Keras callbacks (`keras.callbacks.*`) in a ktrainer run: each Keras hook at its equivalent point.

The wrapped callback sees `self.model` (the module's model, whose `optimizer` is the module's
optimizer, so ReduceLROnPlateau and LearningRateScheduler change the real learning rate, which
checkpoints keep) and `logs` with Keras's names as well as ktrainer's: "train/loss_epoch" is also
"loss", "val/loss" also "val_loss", "val/acc" also "val_acc", "train/acc_step" also "acc" in a
batch's logs. Setting `model.stop_training = True` stops the run at the next check.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from ktrainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["KerasCallback", "wrap_keras_callback", "REFUSED"]

# Keras callbacks that cannot work inside a ktrainer run: what to do instead, as the message's last sentences.
REFUSED = {
    "BackupAndRestore": "Remove it: ktrainer's own checkpoints already resume a run exactly, mid-epoch too. "
                        "To resume, pass ckpt_path=\"last\": trainer.fit(module, ckpt_path=\"last\").",
    "ModelCheckpoint": "Use kt.callbacks.ModelCheckpoint instead (full training state, any fsspec URL, exact "
                       "resume; export_keras=True also writes .keras files).",
    "TensorBoard": "Use kt.loggers.TensorBoardLogger instead (on by default: Trainer(logger=True)).",
    "ProgbarLogger": "Use the Trainer's own progress bar instead (Trainer(enable_progress_bar=True)).",
    "History": "Use the History that trainer.fit(...) returns instead.",
}


def keras_names(values: dict[str, float]) -> dict[str, float]:
    """`values` with Keras's names added: "train/x_epoch"/"train/x_step"/"train/x" -> "x", "val/x" -> "val_x",
    "test/x" -> "x"; names that need no change stay once."""
    logs = dict(values)
    for name, value in values.items():
        stage, _, rest = name.partition("/")
        if not rest:
            continue
        rest = rest.removesuffix("_epoch").removesuffix("_step")
        keras_name = {"train": rest, "val": f"val_{rest}", "test": rest}.get(stage)
        if keras_name is not None and keras_name not in values:
            logs[keras_name] = value
    return logs


def wrap_keras_callback(callback: Any) -> KerasCallback:
    """Wrap a `keras.callbacks.Callback`; refuse, naming ktrainer's equivalent, those that cannot work here.

    Raises:
        ValueError: For BackupAndRestore, Keras's ModelCheckpoint and TensorBoard, ProgbarLogger, History.
    """
    for kind in type(callback).__mro__:
        if kind.__module__.startswith("keras") and kind.__name__ in REFUSED:
            raise ValueError(f"callbacks: keras.callbacks.{kind.__name__} cannot work in a ktrainer run. "
                             f"{REFUSED[kind.__name__]}")
    return KerasCallback(callback)


class KerasCallback(Callback):
    """Runs a Keras callback inside a ktrainer run (see the module docstring for what it sees).

    Args:
        callback: The `keras.callbacks.Callback`.
    """

    def __init__(self, callback: keras.callbacks.Callback) -> None:
        self.callback = callback
        self._settings = constructor_arguments(callback)  # never saved: the resuming script gives them
        self._epoch_logs: dict[str, float] = {}
        self._resumed: dict[str, Any] | None = None  # what a checkpoint gave back, until on_train_begin has run

    @property
    def state_key(self) -> str:
        """"Keras" and the wrapped class."""
        return f"Keras{type(self.callback).__qualname__}"

    def setup(self, trainer: Trainer, module: Module, stage: str) -> None:
        """Forget state a failed call loaded but never put back (the model exists only once the Trainer built it)."""
        self._resumed = None

    def _attach(self, trainer: Trainer, module: Module) -> None:
        model = module.model
        if trainer.optimizer is not None:
            model.optimizer = trainer.optimizer
        model.stop_training = False
        self.callback.set_model(model)
        self.callback.set_params({"epochs": trainer.max_epochs, "steps": trainer.num_training_batches, "verbose": 0})

    def _stop_if_asked(self, trainer: Trainer, module: Module) -> None:
        if getattr(module.model, "stop_training", False) and not trainer.should_stop:
            trainer.should_stop = True
            trainer.stop_reason = f"{type(self.callback).__name__} set model.stop_training"

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        """`on_train_begin`; in a resumed run, then the saved attributes again, as Keras callbacks reset
        themselves there (ReduceLROnPlateau's `wait` and `best`, EarlyStopping's)."""
        self._attach(trainer, module)
        self.callback.on_train_begin(logs={})
        if self._resumed is not None:
            self._put_back(self._resumed)
            self._resumed = None

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """`on_epoch_begin`."""
        self._epoch_logs = {}
        self.callback.on_epoch_begin(trainer.current_epoch, logs={})
        self._stop_if_asked(trainer, module)

    def on_train_batch_start(self, trainer: Trainer, module: Module, batch_idx: int) -> None:
        """`on_train_batch_begin`."""
        self.callback.on_train_batch_begin(batch_idx, logs={})

    def on_train_batch_end(self, trainer: Trainer, module: Module, metrics: dict[str, float], batch_idx: int) -> None:
        """`on_train_batch_end`, with the step's metrics."""
        self.callback.on_train_batch_end(batch_idx, logs=keras_names(metrics))
        self._stop_if_asked(trainer, module)

    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        """`on_test_begin` (Keras runs its callbacks' test hooks around fit's validation too)."""
        if trainer.state.stage == "validate":
            self._attach(trainer, module)
        self.callback.on_test_begin(logs={})

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """`on_test_end`, with the validation results."""
        results = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self._epoch_logs.update(results)
        self.callback.on_test_end(logs=keras_names(results))

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """`on_epoch_end`, with the epoch's metrics and its validation's, under Keras's names too."""
        logs = {k: v for k, v in trainer.callback_metrics.items() if k.endswith("_epoch") or k.startswith("val/")}
        logs = keras_names({**logs, **self._epoch_logs})
        self.callback.on_epoch_end(trainer.current_epoch, logs={k: v for k, v in logs.items() if math.isfinite(v)})
        self._stop_if_asked(trainer, module)

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        """`on_train_end` (e.g. Keras's EarlyStopping restores its best weights here)."""
        self.callback.on_train_end(logs=keras_names(dict(trainer.callback_metrics)))

    def on_test_start(self, trainer: Trainer, module: Module) -> None:
        """`on_test_begin`."""
        self._attach(trainer, module)
        self.callback.on_test_begin(logs={})

    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        """`on_test_end`, with the test results."""
        self.callback.on_test_end(logs=keras_names({k: v for k, v in trainer.callback_metrics.items()
                                                    if k.startswith("test/")}))

    def on_predict_start(self, trainer: Trainer, module: Module) -> None:
        """`on_predict_begin`."""
        self._attach(trainer, module)
        self.callback.on_predict_begin(logs={})

    def on_predict_end(self, trainer: Trainer, module: Module) -> None:
        """`on_predict_end`."""
        self.callback.on_predict_end(logs={})

    def state_dict(self) -> dict[str, Any]:
        """The wrapped callback's attributes that are not its constructor's arguments and are numbers, strings or
        lists of arrays: what it counts and keeps (ReduceLROnPlateau's `wait`, `best`, `cooldown_counter`;
        EarlyStopping's, and its `best_weights`), so a resumed run continues its schedule, while its settings
        are the ones the resuming script gives."""
        return {name: value for name, value in vars(self.callback).items()
                if (isinstance(value, bool | int | float | str) or _is_arrays(value)) and name not in self._settings
                and name != "_chief_worker_only"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back the attributes `state_dict` saved (and again after `on_train_begin` resets them)."""
        # a checkpoint of an earlier version saved the settings too
        self._resumed = {name: value for name, value in state.items() if name not in self._settings}
        self._put_back(self._resumed)

    def _put_back(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self.callback, name, value)


def _is_arrays(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(each, np.ndarray) for each in value)


def constructor_arguments(callback: Any) -> set[str]:
    """The names of the arguments of the `__init__` of `callback`'s class and its bases (its settings).

    Keras keeps a setting as an attribute of the same name, and may change it as it runs (a monitor callback
    negates `min_delta` when it first compares): put back from a checkpoint, it would be changed twice.
    """
    names: set[str] = set()
    for kind in type(callback).__mro__:
        init = kind.__dict__.get("__init__")
        if init is not None and kind is not object:
            try:
                names.update(inspect.signature(init).parameters)
            except (TypeError, ValueError):  # a builtin's __init__ without a signature
                continue
    return names - {"self", "args", "kwargs"}
