"""What the Trainer offers on the state it trains and the metrics it reports: checkpoints, precision, metrics.

`Trainer` inherits these from `StateMethods` so that trainer.py reads as its arguments, its properties and
fit/validate/test/predict; each method here is a public Trainer method, documented on the Trainer's page.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ktrainer.callbacks import ModelCheckpoint
from ktrainer.checks import check_path, check_storage_options
from ktrainer.loop.fit_loop import save_checkpoints_now
from ktrainer.precision import LayerPrecision
from ktrainer.precision.report import precision_report
from ktrainer.trainer.saving import save_checkpoint_at
from ktrainer.trainer.state_dict import load_trainer_state_dict, trainer_state_dict
from ktrainer.utils.fs import Location

if TYPE_CHECKING:
    from ktrainer.module import Module

__all__ = ["StateMethods"]


class StateMethods:
    """The Trainer's checkpoint methods (`state_dict`, `load_state_dict`, `save_checkpoint`, `checkpoint_dir`,
    `checkpoint_callback`), `precision_report`, its metrics (`callback_metrics`, `logged_metrics`,
    `progress_bar_metrics`) and `log_metrics`: see `Trainer`."""

    @property
    def callback_metrics(self) -> dict[str, float]:
        """The latest value of every metric, under its logged and its plain name (for callbacks)."""
        return self.reporter.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, float]:
        """The latest value of every metric sent to the loggers."""
        return self.reporter.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """What the progress bar shows, by label."""
        return self.reporter.progress_bar_metrics

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first ModelCheckpoint among the callbacks, or None."""
        return next((c for c in self.callbacks if isinstance(c, ModelCheckpoint)), None)

    @property
    def checkpoint_dir(self) -> Location:
        """Where `ckpt_path="last"`/`"best"` look: the first ModelCheckpoint's dirpath, else `{root}/checkpoints`."""
        callback = self.checkpoint_callback
        if callback is not None:
            return callback.resolve_location(self.default_root_dir, self.storage_options)
        return Location(f"{self.default_root_dir.rstrip('/')}/checkpoints", self.storage_options)

    def _named_checkpoint(self, ckpt_path: str | None) -> str | None:
        """"best" after this Trainer's fit: its ModelCheckpoint's `best_model_path`, as in Lightning (not a better
        checkpoint of an unrelated run in the same directory); else `ckpt_path` as given."""
        callback = self.checkpoint_callback
        if ckpt_path == "best" and callback is not None and callback.best_model_path:
            return callback.best_model_path
        return ckpt_path

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds to continue this run exactly, by section.

        Sections: "model" and "optimizer" (every variable, by "index:path"; the live variables,
        read when written), "accumulation" (a partial gradient-accumulation group), "progress",
        "random", "callbacks" and "loggers" (each one's state_dict by its unique key),
        "precision", "metrics" (the training metric objects'), and "run" (id, lineage, global
        batch size, precision, hyperparameters, shuffle).

        Raises:
            RuntimeError: Before the model and optimizer are built (inside fit).
        """
        self._require_built("Trainer.state_dict()")
        return trainer_state_dict(self, self.module, self.train_step)

    def _require_built(self, call: str) -> None:
        """Refuse `call` before fit built the model, its optimizer and the training step (a state to save)."""
        module = self.module
        if module is None or module.model is None or self.optimizer is None or self.train_step is None:
            raise RuntimeError(f"{call} needs a built model and optimizer: call it during fit (e.g. from a "
                               "callback) or after fit.")

    def load_state_dict(self, state: dict[str, Any], *, copy: bool = True) -> None:
        """Continue from what `state_dict()` returned (a checkpoint's state): everything, or nothing.

        Every check runs before anything is loaded: the variables must match the model's and
        optimizer's (names and shapes), and the global batch size the saved one (unless
        `allow_global_batch_change`). Callbacks and loggers are matched by key; a key on one side
        only is named in a warning.

        Args:
            state: The state.
            copy: True: the variables get copies of the arrays (a later write to one changes no weight).
                False: the arrays are given away (nothing will read or write them again, as with a checkpoint
                `find_checkpoint` read for this call): on a CPU the variables may use their memory in place,
                and training then changes them. `fit(ckpt_path=...)` gives its checkpoint's arrays away.

        Raises:
            ValueError: When the checkpoint does not fit this model, optimizer or global batch.
        """
        load_trainer_state_dict(self, self.module, self.train_step, state, copy)

    def save_checkpoint(self, filepath: str | os.PathLike | None = None, *,
                        storage_options: dict[str, Any] | None = None) -> list[str]:
        """Save a checkpoint of the full training state now, and wait until it is committed.

        Args:
            filepath: Where (a path or any fsspec URL): one checkpoint there, outside every
                ModelCheckpoint's retention; `fit(module, ckpt_path=filepath)` resumes from it. A
                checkpoint of this run there is replaced; one of another run, a folder of other files
                and a `step-...` name (a ModelCheckpoint's) are refused. Only the chief process
                writes and the others return at once: read it from them once the chief's call
                returned (after fit, say). A state sharded over several processes
                (`strategy="fsdp"`/`"model_parallel"`) is written by all of them, each its own slices:
                there every process must call it, at the same point. None: save through every
                ModelCheckpoint, as its own saves (retention applies).
            storage_options: fsspec options for `filepath`; default: the Trainer's.

        Returns:
            The URLs of the checkpoints saved (empty outside the chief, or without a ModelCheckpoint).

        Raises:
            RuntimeError: Before the model and optimizer are built (call it during or after fit).
            ValueError: For a `step-...` name.
            CheckpointError: When `filepath` holds another run's checkpoint, a folder of other files or a
                file, or the write fails.
        """
        if filepath is None:
            return save_checkpoints_now(self, "manual")
        options = self.storage_options if storage_options is None else check_storage_options(
            "storage_options", storage_options)
        path = check_path("filepath", filepath)
        self._require_built("save_checkpoint(path)")
        saved = save_checkpoint_at(self, path, options)
        return [] if saved is None else [saved]

    def precision_report(self, module: Module | None = None) -> dict[str, LayerPrecision]:
        """Compute and variable dtype of every layer of the module's model, by layer name.

        Args:
            module: The module; default: the one of the last fit/validate/test/predict call.

        Returns:
            {layer name: LayerPrecision(class_name, compute_dtype, variable_dtype)}.

        Raises:
            RuntimeError: If the module's model is not built yet.
        """
        module = module or self.module
        if module is None or module.model is None:
            raise RuntimeError("precision_report() needs a built model: call it after trainer.fit(module) "
                               "(or validate/test/predict), or pass the module.")
        return precision_report(module.model)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Send metrics to every logger (and to `callback_metrics`), at `step` or the global step."""
        self.reporter.log(metrics, self.global_step if step is None else step, self.current_epoch)
