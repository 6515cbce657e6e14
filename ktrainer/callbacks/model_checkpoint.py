"""Save the full training state on a schedule, keep what the retention rules say, never lose a good one."""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ktrainer.callbacks.callback import Callback
from ktrainer.checkpoint.async_io import AsyncCheckpointIO
from ktrainer.checkpoint.format import checkpoint_name
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.manager import CheckpointManager
from ktrainer.checkpoint.retention import Retention
from ktrainer.checkpoint.save_policy import SavePolicy, should_save
from ktrainer.checks import check_bool, check_choice, check_int, check_path, check_storage_options
from ktrainer.compat.keras_internals import tensorflow_left_alone
from ktrainer.utils.fs import Location

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["ModelCheckpoint"]

log = logging.getLogger("ktrainer")


class ModelCheckpoint(Callback):
    """Writes checkpoints of the full training state and prunes them (the one owner of retention).

    A checkpoint holds the model's variables, the optimizer's (slots, iteration count, loss-scale
    variables), the run's `Progress` (step, epoch, batch within the epoch, the epoch's running
    metric sums, the shuffle seed), the random state, every callback's and logger's state and the
    hyperparameters: `trainer.fit(module, ckpt_path=...)` continues from it as if the run had
    never stopped. Every save commits this run's state, also over a checkpoint of the same name
    left by another run or an abandoned branch (atomically: see `FsspecCheckpointIO`).

    When to save: every `every_n_train_steps` optimizer steps, every `every_n_epochs` epochs, every
    `train_time_interval` seconds, and at the end of fit with `save_last`. With none of the first
    three given, every epoch. With a `monitor` and `every_n_epochs`, also after each validation
    inside those epochs (`val_check_interval`), ranked by what it measured, as in Lightning.

    What to keep, after each new checkpoint is committed: the newest `max_to_keep` by commit
    order; the best `save_top_k` by `monitor`; every `keep_every_n_steps`-th step; the newest; the
    checkpoint the run resumed from. Only checkpoints this callback wrote (in this run or a run
    with the same callback settings) are deleted; a failed delete is a warning.

    Args:
        dirpath: Where checkpoints go (a path or any fsspec URL); None: `{default_root_dir}/checkpoints`.
        every_n_train_steps: Save every N optimizer steps.
        every_n_epochs: Save every N epochs.
        train_time_interval: Save when this many seconds passed since the last save.
        save_last: Also save when fit ends.
        max_to_keep: Keep the newest N; None keeps all.
        save_top_k: Also keep the best K by `monitor`.
        monitor: The metric ranking checkpoints, e.g. "val/loss".
        mode: "min" or "max" for `monitor`.
        keep_every_n_steps: Keep checkpoints at multiples of N steps forever.
        verify: Read back the manifest and sizes after each save.
        verify_checksums: Also read back every file and check its checksum.
        async_save: Write in a background thread; the loop waits only for the copy to host memory.
        export_keras: Also write portable `export/last.keras` (and `export/best.keras` with a monitor).
        storage_options: fsspec options for `dirpath`; default: the Trainer's.
        fsync: On a local disk, flush each checkpoint to the disk before it counts as committed and
            before anything older is deleted, so a power loss or an OS crash cannot cost a checkpoint
            (about 1 s per GB here); False leaves that to the operating system.

    Raises:
        ValueError: For a bad value of any argument (named, with what is allowed), `save_top_k`
            without `monitor`, or a `dirpath` that is an existing file.

    Attributes:
        last_saved: The URL of the newest checkpoint of this run (also `last_model_path`). These
            attributes are the same on every process; only the chief writes.
        best_value: The best value of `monitor` saved so far, carried across resumes (also `best_model_score`).
        best_model_path: The URL of the checkpoint holding `best_value` (what `ckpt_path="best"` loads
            when this callback wrote the directory), carried across resumes; None without a monitor,
            before the first save, or when retention may delete it (`save_top_k=0` with a `max_to_keep`).
        resumed_from: The name of the checkpoint in `dirpath` the run resumed from, if any.
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, *, every_n_train_steps: int | None = None,
                 every_n_epochs: int | None = None, train_time_interval: float | None = None,
                 save_last: bool = True, max_to_keep: int | None = 3, save_top_k: int = 0,
                 monitor: str | None = None, mode: str = "min", keep_every_n_steps: int | None = None,
                 verify: bool = True, verify_checksums: bool = False, async_save: bool = False,
                 export_keras: bool = False, storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> None:
        self.dirpath = check_path("dirpath", dirpath, allow_none=True)
        if self.dirpath is not None and "://" not in self.dirpath and os.path.isfile(self.dirpath):
            raise ValueError(f"dirpath={self.dirpath!r} is an existing file; ModelCheckpoint needs a directory "
                             "(existing or not). Choose another dirpath.")
        self.every_n_train_steps = check_int("every_n_train_steps", every_n_train_steps, minimum=1, allow_none=True)
        self.every_n_epochs = check_int("every_n_epochs", every_n_epochs, minimum=1, allow_none=True)
        if train_time_interval is not None and not (isinstance(train_time_interval, int | float)
                                                    and not isinstance(train_time_interval, bool)
                                                    and train_time_interval > 0):
            raise ValueError(f"train_time_interval must be seconds > 0 or None, got {train_time_interval!r}.")
        self.train_time_interval = train_time_interval
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            self.every_n_epochs = 1
        self.save_last = check_bool("save_last", save_last)
        self.max_to_keep = check_int("max_to_keep", max_to_keep, minimum=1, allow_none=True)
        self.save_top_k = check_int("save_top_k", save_top_k, minimum=0)
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise ValueError(f"monitor must be a metric name such as 'val/loss', or None; got {monitor!r}.")
        if self.save_top_k and not monitor:
            raise ValueError("save_top_k needs monitor=..., the metric that ranks checkpoints (e.g. 'val/loss').")
        self.monitor = monitor
        self.mode = check_choice("mode", mode, ("min", "max"))
        self.keep_every_n_steps = check_int("keep_every_n_steps", keep_every_n_steps, minimum=1, allow_none=True)
        self.verify = check_bool("verify", verify)
        self.verify_checksums = check_bool("verify_checksums", verify_checksums)
        self.async_save = check_bool("async_save", async_save)
        self.export_keras = check_bool("export_keras", export_keras)
        self.fsync = check_bool("fsync", fsync)
        self.storage_options = None if storage_options is None else check_storage_options(
            "storage_options", storage_options)
        self.manager = CheckpointManager(verify=self.verify, verify_checksums=self.verify_checksums,
                                         fsync=self.fsync, async_save=self.async_save)
        self.best_value: float | None = None
        self.best_model_path: str | None = None
        self._last_saved_step = -1
        self._last_time = time.monotonic()
        self._trainer: Trainer | None = None
        self._module: Module | None = None

    @property
    def state_key(self) -> str:
        """The class and the settings that make it the same callback in another run (also its `owner`).

        `dirpath` in its canonical spelling ("ckpts", "./ckpts" and its absolute path are one), numbers
        as floats (3600 and 3600.0 are one).
        """
        where = Location(self.dirpath, self.storage_options or {}).canonical_url if self.dirpath else None
        interval = None if self.train_time_interval is None else float(self.train_time_interval)
        return self._state_key_with(dirpath=where, monitor=self.monitor, mode=self.mode,
                                    every_n_train_steps=self.every_n_train_steps, every_n_epochs=self.every_n_epochs,
                                    train_time_interval=interval)

    @property
    def io(self) -> FsspecCheckpointIO | AsyncCheckpointIO | None:
        """The storage of `dirpath` (its manager's), once fit set it up."""
        return self.manager.io

    @property
    def location(self) -> Location | None:
        """`dirpath` resolved (fsspec filesystem and path), once fit set it up."""
        return self.manager.location

    @property
    def last_saved(self) -> str | None:
        """The URL of the newest checkpoint of this run (the same on every process; only the chief writes)."""
        return self.manager.last_saved

    @last_saved.setter
    def last_saved(self, url: str | None) -> None:
        self.manager.last_saved = url

    @property
    def resumed_from(self) -> str | None:
        """The name of the checkpoint in `dirpath` the run resumed from, if any (retention keeps it)."""
        return self.manager.resumed_from

    @property
    def policy(self) -> SavePolicy:
        """When this callback saves: its step, epoch and time triggers."""
        return SavePolicy(self.every_n_train_steps, self.every_n_epochs, self.train_time_interval)

    def resolve_location(self, default_root_dir: str, storage_options: dict[str, Any]) -> Location:
        """Where this callback's checkpoints go, given the Trainer's root and storage options."""
        options = self.storage_options if self.storage_options is not None else storage_options
        return Location(self.dirpath or f"{default_root_dir.rstrip('/')}/checkpoints", options)

    # ----- hooks ----------------------------------------------------------------------------

    def setup(self, trainer: Trainer, module: Module, stage: str) -> None:
        """Resolve `dirpath` and check it is not a file, before anything is written."""
        self._trainer, self._module = trainer, module
        if stage != "fit":
            return
        location = self.resolve_location(trainer.default_root_dir, trainer.storage_options)
        if location.fs.isfile(location.path):
            raise ValueError(f"ModelCheckpoint dirpath {location.url!r} is an existing file; it needs a "
                             "directory (existing or not). Choose another dirpath.")
        retention = Retention(self.max_to_keep, self.save_top_k, self.mode, self.keep_every_n_steps)
        self.manager.open(location, owner=self.state_key, retention=retention, monitor=self.monitor)
        self._last_time = self._now()

    # Last in the hooks where it saves (after the callbacks whose state it saves); first where it notes the run,
    # saves the state training ended with (before a callback restores other weights) and settles its writes.
    runs_first_in = ("on_fit_start", "on_train_end", "on_fit_end", "on_exception")

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        """Note the checkpoint the run resumed from (kept by retention), and the newest commit time in `dirpath`:
        this run's commits come after it, so 'last' is this run's latest even if this host's clock runs behind."""
        self.manager.start_run(trainer)

    def on_train_batch_end(self, trainer: Trainer, module: Module, metrics: dict[str, float], batch_idx: int) -> None:
        """Save when a step or time trigger is due: as the loop decided when it dispatched this execution
        (`trainer.state.planned_saves`), else now."""
        planned = trainer.state.planned_saves
        reason = planned[id(self)] if planned is not None and id(self) in planned else self.save_due(
            trainer.global_step, trainer.clock.now())
        if reason is not None:
            self.save(trainer, reason=reason)

    def save_due(self, global_step: int, now: float | None = None) -> str | None:
        """Why a batch end at `global_step` saves ("step", "time"), or None.

        The loop asks when it dispatches an execution, before the one in flight is read back, so a
        save is decided where the state it must see is still to be had (see `FitLoop`). `now`: the
        run's clock (`trainer.clock.now()`, the chief's with several processes, so every process
        decides alike); None reads it here.
        """
        return should_save(self.policy, global_step=global_step, last_saved_step=self._last_saved_step,
                           now=self._now() if now is None else now, last_saved_time=self._last_time)

    def _now(self) -> float:
        """The run's clock (the Trainer's, shared by its processes); this process's before a Trainer set it up."""
        clock = getattr(self._trainer, "clock", None)
        return time.monotonic() if clock is None else clock.now()

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Save at the end of every `every_n_epochs`-th epoch."""
        if trainer.progress.epoch_done and self.policy.epoch_due(trainer.current_epoch):
            self.save(trainer, reason="epoch")

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """With a monitor and an epoch trigger, save after a validation inside an epoch: its metric is fresh there
        (an epoch-end validation is saved at the epoch's end, with the epoch's metrics)."""
        if (self.monitor and trainer.state.stage == "fit" and not trainer.state.at_epoch_end
                and self.policy.epoch_due(trainer.current_epoch)):
            self.save(trainer, reason="validation")

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        """Save the final state with `save_last` (before an optimizer's moving averages replace the weights:
        the checkpoint holds both, so a resume stays exact)."""
        if self.save_last:
            self.save(trainer, reason="last")

    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        """Wait for the last write (raising its failure); export the final weights with `export_keras`."""
        self.wait()
        if self.export_keras and trainer.is_global_zero:
            self._export("last")

    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        """Let a write in flight finish (its own failure is logged, not raised over the first error)."""
        try:
            self.wait()
        except Exception as error:  # noqa: BLE001 - the first error is the one the user must see
            log.error("A background checkpoint save also failed: %r", error)

    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        """Stop the background writer (after the write in flight), also after an error."""
        self.manager.close()

    # ----- saving -----------------------------------------------------------------------------

    def save(self, trainer: Trainer, reason: str = "manual") -> None:
        """Save the training state now (the loop blocks only for the copy to host memory when `async_save`).

        Only the chief process writes (the others note what it wrote: `last_saved`, the best); nothing
        happens when this very progress (step, epoch, batch, pending validation, ...) is already saved
        (by this run, or as the checkpoint the run resumed from). A save that fails does not count as
        done. At preemption, a failure of the previous background save is logged and the save goes ahead.

        Args:
            trainer: The Trainer.
            reason: Why ("step", "epoch", "validation", "time", "last", "preemption", "manual"): recorded in
                the manifest.

        Raises:
            CheckpointError: When this save fails synchronously, or the previous background save failed.
        """
        if self.io is None:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if math.isfinite(v)}
        new_best = False

        def note() -> Callable[[], None]:  # once the save goes ahead, before the state is taken
            nonlocal new_best
            before = (self._last_saved_step, self.best_value, self.best_model_path)
            self._last_saved_step, self._last_time = trainer.global_step, self._now()
            new_best = self._note_metric(metrics)
            if new_best and (self.save_top_k >= 1 or self.max_to_keep is None):  # retention keeps it
                self.best_model_path = f"{self.io.url}/{checkpoint_name(trainer.global_step)}"

            def undo() -> None:
                self._last_saved_step, self.best_value, self.best_model_path = before  # the time trigger waits
            return undo

        fields = {"metrics": metrics, "monitor": self.monitor, "mode": self.mode, "reason": reason}
        saved = self.manager.save(trainer, checkpoint_name(trainer.global_step), fields,
                                  preempted=reason == "preemption", note=note)
        if saved is not None and new_best and self.export_keras and trainer.is_global_zero:
            self._export("best")  # in this thread: it reads the live model

    def wait(self) -> None:
        """Wait for the save in flight, if any; raise its error."""
        self.manager.wait()

    def _note_metric(self, metrics: dict[str, float]) -> bool:
        """Track the best monitored value; True when this save is the best so far."""
        if not self.monitor:
            return False
        value = metrics.get(self.monitor)
        if value is None:
            log.warning("ModelCheckpoint(monitor=%r): no such metric at step %d; this checkpoint is not ranked.",
                        self.monitor, self._last_saved_step)
            return False
        better = self.best_value is None or (value < self.best_value if self.mode == "min" else value > self.best_value)
        if better:
            self.best_value = value
        return better

    def _export(self, which: str) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, f"{which}.keras")
            with tensorflow_left_alone():
                self._module.model.save(path)
            with open(path, "rb") as handle:
                self.location.join("export").write_bytes(f"{which}.keras", handle.read(), atomic=True)

    # ----- state --------------------------------------------------------------------------

    @property
    def best_model_score(self) -> float | None:
        """The best value of `monitor` among this run's saves (and the runs it continues); None without one."""
        return self.best_value

    @property
    def last_model_path(self) -> str | None:
        """The URL of the newest checkpoint this callback committed in this run; None before the first."""
        return self.last_saved

    def state_dict(self) -> dict[str, Any]:
        """The last saved step and position, and the best monitored value and its checkpoint."""
        return {"last_saved_step": self._last_saved_step, "last_saved_position": self.manager.saved_position,
                "best_value": self.best_value, "best_model_path": self.best_model_path}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the last saved step and position, and the best monitored value and its checkpoint."""
        self._last_saved_step = int(state.get("last_saved_step", -1))
        position = state.get("last_saved_position")
        self.manager.saved_position = position if isinstance(position, dict) else None
        best = state.get("best_value")
        self.best_value = float(best) if isinstance(best, int | float) else None
        path = state.get("best_model_path")
        self.best_model_path = path if isinstance(path, str) else None

