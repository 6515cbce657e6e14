"""The Callback base class: every hook, listed once, in the order the Trainer calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["Callback"]


class Callback:
    """Base class of callbacks. Every hook is a documented no-op; override the ones you need.

    Order within `Trainer.fit`:
        setup -> on_fit_start -> (on_train_epoch_start -> (on_train_batch_start ->
        on_train_batch_end)* -> [on_validation_start -> on_validation_epoch_start ->
        on_validation_epoch_end -> on_validation_end] -> on_train_epoch_end)* -> on_train_end ->
        on_fit_end -> teardown. (docs/guide.md shows it with the Module's hooks.)
    On an error anywhere in between: on_exception, then teardown; the error then reaches the
    caller unchanged. `validate`/`test` call on_validation_*/on_test_*, `predict` calls
    on_predict_*, each between setup and teardown.

    Batch hooks run once per compiled execution: every step when `steps_per_execution=1`,
    every N steps otherwise (as in Keras), with `trainer.global_step` already advanced.

    Callbacks run in the order of `trainer.callbacks`, except in the hooks a callback names in
    `runs_first_in`, where it runs before the others (ModelCheckpoint: it notes the run at
    `on_fit_start`, saves the state training ended with at `on_train_end` before a callback
    restores other weights, and settles its writes at `on_fit_end`/`on_exception`).
    """

    runs_first_in: tuple[str, ...] = ()

    def setup(self, trainer: Trainer, module: Module, stage: str) -> None:
        """Called when fit/validate/test/predict begins, before the model is built.

        Args:
            trainer: The Trainer.
            module: The Module.
            stage: "fit", "validate", "test" or "predict".
        """

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        """Called once the model and optimizer exist, before the first epoch."""

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Called at the start of each training epoch."""

    def on_train_batch_start(self, trainer: Trainer, module: Module, batch_idx: int) -> None:
        """Called before each compiled execution; `batch_idx` is the first batch it runs."""

    def on_train_batch_end(self, trainer: Trainer, module: Module, metrics: dict[str, float], batch_idx: int) -> None:
        """Called after each compiled execution.

        Args:
            trainer: The Trainer.
            module: The Module.
            metrics: The step metrics of the last batch run (e.g. "train/loss_step").
            batch_idx: Index, within the epoch, of the last batch run.
        """

    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        """Called before a validation loop (within fit, or by `validate`)."""

    def on_validation_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Called right before the validation batches, after the module's validation metrics were reset."""

    def on_validation_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Called right after the validation batches, after the module's `on_validation_epoch_end`."""

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """Called after a validation loop; `trainer.callback_metrics` holds its results."""

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Called at the end of each training epoch, after its validation."""

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        """Called when the training loop ends normally, before an optimizer's moving averages (`use_ema`)
        replace the weights: the raw state, which a resume continues from."""

    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        """Called when fit ends normally, last (the weights are the final ones, averaged under `use_ema`)."""

    def on_test_start(self, trainer: Trainer, module: Module) -> None:
        """Called before the test loop."""

    def on_test_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Called right before the test batches, after the module's test metrics were reset."""

    def on_test_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Called right after the test batches, after the module's `on_test_epoch_end`."""

    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        """Called after the test loop."""

    def on_predict_start(self, trainer: Trainer, module: Module) -> None:
        """Called before the predict loop."""

    def on_predict_end(self, trainer: Trainer, module: Module) -> None:
        """Called after the predict loop."""

    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        """Called when an error interrupts fit/validate/test/predict, before teardown."""

    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        """Called last, also after an error."""

    def state_dict(self) -> dict[str, Any]:
        """The callback's state, saved in checkpoints (JSON-serializable values)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by `state_dict`."""

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint.

        The class name by default; built-ins that a run may hold several of add the arguments that
        tell them apart (e.g. `EarlyStopping{'monitor': 'val/loss', 'mode': 'min'}`). Two callbacks
        with the same key are numbered by the Trainer (`key#2`).
        """
        return type(self).__qualname__

    def _state_key_with(self, **identity: Any) -> str:
        """A state key from the class name and the arguments that identify this instance."""
        return f"{type(self).__qualname__}{identity!r}"
