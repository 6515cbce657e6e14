"""Save the full training state on a schedule, keep what the retention rules say, never lose a good one."""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
import warnings
from typing import Any

from ktrainer.callbacks.callback import Callback
from ktrainer.checkpoint.async_io import AsyncCheckpointIO
from ktrainer.checkpoint.format import checkpoint_name
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.io import CheckpointError, CheckpointInfo
from ktrainer.checkpoint.payload import checkpoint_payload
from ktrainer.checkpoint.retention import Entry, Retention, to_delete
from ktrainer.checkpoint.snapshot import freeze
from ktrainer.checkpoint.variables import read_value, start_host_copies
from ktrainer.checks import check_bool, check_choice, check_int, check_path, check_storage_options
from ktrainer.compat.keras_internals import tensorflow_left_alone
from ktrainer.utils.fs import Location

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
        self.io: FsspecCheckpointIO | AsyncCheckpointIO | None = None
        self.location: Location | None = None
        self.resumed_from: str | None = None
        self.last_saved: str | None = None
        self.best_value: float | None = None
        self.best_model_path: str | None = None
        self._last_saved_step = -1
        self._last_saved_position: dict[str, Any] | None = None
        self._unsaved: tuple | None = None
        self._last_time = time.monotonic()
        self._saves = 0
        self._commit_floor = 0.0
        self._undeletable: set[str] = set()
        self._trainer: Any = None
        self._module: Any = None

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

    def resolve_location(self, default_root_dir: str, storage_options: dict[str, Any]) -> Location:
        """Where this callback's checkpoints go, given the Trainer's root and storage options."""
        options = self.storage_options if self.storage_options is not None else storage_options
        return Location(self.dirpath or f"{default_root_dir.rstrip('/')}/checkpoints", options)

    # ----- hooks ----------------------------------------------------------------------------

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        """Resolve `dirpath` and check it is not a file, before anything is written."""
        self._trainer, self._module = trainer, module
        if stage != "fit":
            return
        self.location = self.resolve_location(trainer.default_root_dir, trainer.storage_options)
        if self.location.fs.isfile(self.location.path):
            raise ValueError(f"ModelCheckpoint dirpath {self.location.url!r} is an existing file; it needs a "
                             "directory (existing or not). Choose another dirpath.")
        store = FsspecCheckpointIO(self.location, verify=self.verify, verify_checksums=self.verify_checksums,
                                   fsync=self.fsync)
        self.io = AsyncCheckpointIO(store) if self.async_save else store
        self._last_time = self._now()
        self._saves = 0
        self.resumed_from = None

    # Last in the hooks where it saves (after the callbacks whose state it saves); first where it notes the run,
    # saves the state training ended with (before a callback restores other weights) and settles its writes.
    runs_first_in = ("on_fit_start", "on_train_end", "on_fit_end", "on_exception")

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        """Note the checkpoint the run resumed from (kept by retention), and the newest commit time in `dirpath`:
        this run's commits come after it, so 'last' is this run's latest even if this host's clock runs behind."""
        run = trainer.run
        self._commit_floor = run.parent_committed
        if run.parent is not None:
            parent, _, name = run.parent.rpartition("/")
            self.resumed_from = name if parent == self.location.canonical_url else None
        if trainer.is_global_zero:
            try:
                committed = [info.committed for info in self.io.list() if info.manifest is not None]
            except OSError as error:
                log.warning("Could not list %s at the start (%r); commit times follow this host's clock.",
                            self.location.url, error)
                committed = []
            self._commit_floor = max([self._commit_floor, *committed])

    def on_train_batch_end(self, trainer: Any, module: Any, metrics: dict[str, float], batch_idx: int) -> None:
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
        every = self.every_n_train_steps
        if every is not None and global_step // every > max(self._last_saved_step, 0) // every:
            return "step"
        if self.train_time_interval is not None and (
                (self._now() if now is None else now) - self._last_time >= self.train_time_interval):
            return "time"
        return None

    def _now(self) -> float:
        """The run's clock (the Trainer's, shared by its processes); this process's before a Trainer set it up."""
        clock = getattr(self._trainer, "clock", None)
        return time.monotonic() if clock is None else clock.now()

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        """Save at the end of every `every_n_epochs`-th epoch."""
        if self.every_n_epochs is not None and trainer.progress.epoch_done and (
                (trainer.current_epoch + 1) % self.every_n_epochs == 0):
            self.save(trainer, reason="epoch")

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        """With a monitor and an epoch trigger, save after a validation inside an epoch: its metric is fresh there
        (an epoch-end validation is saved at the epoch's end, with the epoch's metrics)."""
        if (self.monitor and self.every_n_epochs is not None and trainer.state.stage == "fit"
                and not trainer.state.at_epoch_end and (trainer.current_epoch + 1) % self.every_n_epochs == 0):
            self.save(trainer, reason="validation")

    def on_train_end(self, trainer: Any, module: Any) -> None:
        """Save the final state with `save_last` (before an optimizer's moving averages replace the weights:
        the checkpoint holds both, so a resume stays exact)."""
        if self.save_last:
            self.save(trainer, reason="last")

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        """Wait for the last write (raising its failure); export the final weights with `export_keras`."""
        self.wait()
        if self.export_keras and trainer.is_global_zero:
            self._export("last")

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        """Let a write in flight finish (its own failure is logged, not raised over the first error)."""
        try:
            self.wait()
        except Exception as error:  # noqa: BLE001 - the first error is the one the user must see
            log.error("A background checkpoint save also failed: %r", error)

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        """Stop the background writer (after the write in flight), also after an error."""
        if isinstance(self.io, AsyncCheckpointIO):
            self.io.close()

    # ----- saving -----------------------------------------------------------------------------

    def save(self, trainer: Any, reason: str = "manual") -> None:
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
        chief = trainer.is_global_zero
        try:
            if chief:
                self.wait()  # at most one save in flight; raises a failure of the previous one (then not counted)
        except CheckpointError as error:
            if reason != "preemption":
                raise
            log.error("The previous background save failed (%s); saving at preemption all the same.", error)
        position = trainer.progress.state_dict()
        if position == self._last_saved_position:
            return
        step, name = trainer.global_step, checkpoint_name(trainer.global_step)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if math.isfinite(v)}
        before = (self._last_saved_step, self._last_saved_position, self.best_value, self.best_model_path)
        self._last_saved_step, self._last_time, self._last_saved_position = step, self._now(), position
        new_best = self._note_metric(metrics)
        url = f"{self.io.url}/{name}"
        if new_best and (self.save_top_k >= 1 or self.max_to_keep is None):  # retention keeps it
            self.best_model_path = url  # before the state is taken: the checkpoint names itself
        if not chief:  # the chief writes; every process knows what it wrote (the metrics are the same on all)
            self.last_saved = url
            return
        self._saves += 1
        run = trainer.run
        save_id = f"{run.run_id}-{self._saves}"
        state = trainer.state_dict()  # after the updates above: the checkpoint's own state knows itself
        if self.async_save:
            # What the loop waits for (the copy to host memory); the writing happens in the background.
            state = freeze(start_host_copies(state), read_value)
        files, fields = checkpoint_payload(state, self._module.model, run, save_id, {
            "metrics": metrics, "monitor": self.monitor, "mode": self.mode, "owner": self.state_key, "reason": reason})
        if self.export_keras and new_best:
            self._export("best")  # in this thread: it reads the live model
        self._unsaved = before  # put back if this save fails: a failed save must not count as done
        try:
            self.io.write(name, files, fields, on_commit=self._committed,
                          not_before=self._commit_floor)
        except CheckpointError:
            self._forget_failed_save()
            raise

    def wait(self) -> None:
        """Wait for the save in flight, if any; raise its error."""
        if isinstance(self.io, AsyncCheckpointIO):
            try:
                self.io.wait()
            except CheckpointError:
                self._forget_failed_save()
                raise

    def _forget_failed_save(self) -> None:
        if self._unsaved is not None:
            self._last_saved_step, self._last_saved_position, self.best_value, self.best_model_path = self._unsaved
            self._unsaved = None

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

    def _committed(self, info: CheckpointInfo) -> None:
        self._unsaved = None
        self.last_saved = info.url
        self._commit_floor = max(self._commit_floor, info.committed)
        log.debug("Saved checkpoint %s (%.1f MB).", info.url, info.size / 1e6)
        self._prune(info.name)

    def _prune(self, newest: str) -> None:
        """Delete what the retention rules do not keep; a failed delete is a warning, never fatal."""
        rules = Retention(self.max_to_keep, self.save_top_k, self.mode, self.keep_every_n_steps)
        try:
            listed = self.io.list()
        except Exception as error:  # noqa: BLE001 - retention must never end training
            warnings.warn(f"Could not list {self.location.url} to apply retention: {error!r}.", stacklevel=2)
            return
        entries = [self._entry(info) for info in listed]
        protected = [newest] + ([self.resumed_from] if self.resumed_from else [])
        lineage = frozenset(self._trainer.run.lineage if self._trainer else ())
        doomed = to_delete(entries, rules, owner=self.state_key, protected=protected, lineage=lineage)
        save_ids = {info.name: info.fields.get("save_id") for info in listed}
        for name in doomed:
            if name in self._undeletable:
                continue  # refused once: asking again at every save would only repeat the warning
            try:
                self.io.delete(name, save_id=save_ids.get(name), run_ids=lineage)  # what was listed, nothing newer
            except Exception as error:  # noqa: BLE001 - e.g. 403 on a write-once bucket: keep training
                self._undeletable.add(name)
                warnings.warn(f"Could not delete checkpoint {self.location.url}/{name} (retention): {error!r}. "
                              "Training goes on; the checkpoint stays (not retried in this run).", stacklevel=2)

    def _entry(self, info: CheckpointInfo) -> Entry:
        fields = info.fields
        metrics = fields.get("metrics")
        value = metrics.get(self.monitor) if self.monitor and isinstance(metrics, dict) else None
        return Entry(info.name, info.step, info.committed, has_manifest=info.has_manifest, complete=info.valid,
                     owner=fields.get("owner"), known_format=info.newer_format is None, symlink=info.symlink,
                     metric=value if isinstance(value, int | float) else None, run_ids=info.run_ids,
                     run_id=fields.get("run_id"))

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
        return {"last_saved_step": self._last_saved_step, "last_saved_position": self._last_saved_position,
                "best_value": self.best_value, "best_model_path": self.best_model_path}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the last saved step and position, and the best monitored value and its checkpoint."""
        self._last_saved_step = int(state.get("last_saved_step", -1))
        position = state.get("last_saved_position")
        self._last_saved_position = position if isinstance(position, dict) else None
        best = state.get("best_value")
        self.best_value = float(best) if isinstance(best, int | float) else None
        path = state.get("best_model_path")
        self.best_model_path = path if isinstance(path, str) else None

