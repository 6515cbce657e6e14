"""Save the full training state on a schedule, keep what the retention rules say, never lose a good one."""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ktrainer.callbacks.callback import Callback
from ktrainer.checkpoint.manager import CheckpointManager, checkpoint_name
from ktrainer.checkpoint.resume import capture_trainer_state, versions
from ktrainer.checkpoint.state import TrainingState
from ktrainer.errors import check_choice, check_int
from ktrainer.fs import Location

__all__ = ["ModelCheckpoint"]

log = logging.getLogger("ktrainer")


class ModelCheckpoint(Callback):
    """Writes checkpoints of the full training state and prunes them (the one owner of retention).

    A checkpoint holds the model's variables, the optimizer's (slots, iteration count, loss-scale
    variables), the Trainer's progress (step, epoch, batch within the epoch), the random state,
    every callback's state, the logger version and the hyperparameters: `trainer.fit(module,
    ckpt_path=...)` continues from it as if the run had never stopped.

    When to save: every `every_n_train_steps` optimizer steps, every `every_n_epochs` epochs, every
    `train_time_interval` seconds, and at the end of fit with `save_last`. With none of the first
    three given, every epoch.

    What to keep, after each new checkpoint is committed and verified: the newest `max_to_keep`;
    in addition the best `save_top_k` by `monitor` (the newest is never deleted for not being
    among the best); every `keep_every_n_steps`-th step forever; and the checkpoint the run
    resumed from. Nothing else in `dirpath` is touched.

    Args:
        dirpath: Where checkpoints go (any fsspec URL); None: `{default_root_dir}/checkpoints`.
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

    Raises:
        ValueError: For bad intervals or counts, or `save_top_k` without `monitor`.
    """

    def __init__(self, dirpath: str | None = None, *, every_n_train_steps: int | None = None,
                 every_n_epochs: int | None = None, train_time_interval: float | None = None,
                 save_last: bool = True, max_to_keep: int | None = 3, save_top_k: int = 0,
                 monitor: str | None = None, mode: str = "min", keep_every_n_steps: int | None = None,
                 verify: bool = True, verify_checksums: bool = False, async_save: bool = False,
                 export_keras: bool = False, storage_options: dict[str, Any] | None = None) -> None:
        self.dirpath = dirpath
        self.every_n_train_steps = check_int("every_n_train_steps", every_n_train_steps, minimum=1, allow_none=True)
        self.every_n_epochs = check_int("every_n_epochs", every_n_epochs, minimum=1, allow_none=True)
        if train_time_interval is not None and not (isinstance(train_time_interval, int | float)
                                                    and train_time_interval > 0):
            raise ValueError(f"train_time_interval must be seconds > 0 or None, got {train_time_interval!r}.")
        self.train_time_interval = train_time_interval
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            self.every_n_epochs = 1
        self.save_last = save_last
        self.max_to_keep = check_int("max_to_keep", max_to_keep, minimum=1, allow_none=True)
        self.save_top_k = check_int("save_top_k", save_top_k, minimum=0)
        if self.save_top_k and not monitor:
            raise ValueError("save_top_k needs monitor=..., the metric that ranks checkpoints (e.g. 'val/loss').")
        self.monitor = monitor
        self.mode = check_choice("mode", mode, ("min", "max"))
        self.keep_every_n_steps = check_int("keep_every_n_steps", keep_every_n_steps, minimum=1, allow_none=True)
        self.verify, self.verify_checksums = verify, verify_checksums
        self.async_save, self.export_keras = async_save, export_keras
        self.storage_options = storage_options
        self.manager: CheckpointManager | None = None
        self.resumed_from: str | None = None
        self.best_k: list[dict[str, Any]] = []
        self.last_saved: str | None = None
        self._last_saved_step = -1
        self._last_time = time.monotonic()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    # ----- wiring -------------------------------------------------------------------------

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        """Resolve `dirpath` against the Trainer's root and storage options."""
        if self.manager is None:
            options = self.storage_options if self.storage_options is not None else trainer.storage_options
            url = self.dirpath or f"{trainer.default_root_dir.rstrip('/')}/checkpoints"
            self.manager = CheckpointManager(Location(url, options))
        self._last_time = time.monotonic()

    def on_train_batch_end(self, trainer: Any, module: Any, metrics: dict[str, float], batch_idx: int) -> None:
        """Save when a step or time trigger is due."""
        every = self.every_n_train_steps
        due_steps = every is not None and trainer.global_step // every > max(self._last_saved_step, 0) // every
        due_time = self.train_time_interval is not None and (
            time.monotonic() - self._last_time >= self.train_time_interval)
        if due_steps or due_time:
            self.save(trainer)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        """Save at the end of every `every_n_epochs`-th epoch."""
        if self.every_n_epochs is not None and trainer.state.epoch_ended and (
                (trainer.current_epoch + 1) % self.every_n_epochs == 0):
            self.save(trainer)

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        """Save the final state with `save_last`, then wait for the last write."""
        if self.save_last:
            self.save(trainer)
        self.wait()
        if self.export_keras and trainer.is_global_zero:
            self._export(trainer, "last")

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        """Let a write in flight finish (its own failure is logged, not raised over the first error)."""
        try:
            self.wait()
        except Exception as error:  # noqa: BLE001 - the first error is the one the user must see
            log.error("A background checkpoint save also failed: %r", error)

    # ----- saving -------------------------------------------------------------------------

    def save(self, trainer: Any) -> None:
        """Save now (the loop blocks only for the copy to host memory when `async_save`)."""
        if not trainer.is_global_zero or trainer.global_step == self._last_saved_step:
            return
        self.wait()  # at most one save in flight; raises a failure of the previous one
        name = checkpoint_name(trainer.global_step)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if math.isfinite(v)}
        self._last_saved_step, self._last_time = trainer.global_step, time.monotonic()
        self._rank(name, metrics)  # before the capture, so the checkpoint's own state knows itself
        state = capture_trainer_state(trainer, copy=self.async_save)
        info = {"step": trainer.global_step, **state.trainer["progress"], "metrics": metrics,
                "monitor": self.monitor, "mode": self.mode, "hparams": state.trainer.get("hparams", {}),
                "versions": versions()}
        if self.export_keras and self.best_k and self.best_k[0]["name"] == name:
            self._export(trainer, "best")  # in this thread: it reads the live model
        best = [entry["name"] for entry in self.best_k[: self.save_top_k]]
        if self.async_save:
            self._executor = self._executor or ThreadPoolExecutor(1, thread_name_prefix="ktrainer-ckpt")
            self._pending = self._executor.submit(self._write, name, state, info, best)
        else:
            self._write(name, state, info, best)

    def wait(self) -> None:
        """Wait for the save in flight, if any; raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _write(self, name: str, state: TrainingState, info: dict[str, Any], best: list[str]) -> None:
        written = self.manager.save(name, state.to_files(), info, verify=self.verify,
                                    verify_checksums=self.verify_checksums)
        self.last_saved = written.url
        log.info("Saved checkpoint %s (%.1f MB).", written.url, written.size / 1e6)
        self._prune(written.name, best)

    def _rank(self, name: str, metrics: dict[str, float]) -> None:
        if not self.monitor:
            return
        value = metrics.get(self.monitor)
        if value is None:
            log.warning("ModelCheckpoint(monitor=%r): no such metric at %s; this checkpoint is not ranked.",
                        self.monitor, name)
            return
        self.best_k.append({"name": name, "value": value})
        self.best_k.sort(key=lambda entry: entry["value"], reverse=self.mode == "max")
        del self.best_k[max(self.save_top_k, 1):]

    def _prune(self, newest: str, best: list[str]) -> None:
        checkpoints = self.manager.list()
        valid = [c.name for c in checkpoints if c.valid]
        keep = {newest, self.resumed_from, *best}
        keep.update(valid[-self.max_to_keep:] if self.max_to_keep else valid)
        if self.keep_every_n_steps:
            keep.update(c.name for c in checkpoints if c.valid and c.step % self.keep_every_n_steps == 0)
        for checkpoint in checkpoints:
            if checkpoint.name not in keep:
                self.manager.delete(checkpoint.name)  # old ones, and leftovers of interrupted saves

    def _export(self, trainer: Any, which: str) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, f"{which}.keras")
            trainer._module.model.save(path)
            with open(path, "rb") as handle:
                self.manager.location.join("export").write_bytes(f"{which}.keras", handle.read())

    # ----- state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The best-k list and the last saved step."""
        return {"best_k": self.best_k, "last_saved_step": self._last_saved_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the best-k list and the last saved step."""
        self.best_k = list(state.get("best_k", []))
        self._last_saved_step = int(state.get("last_saved_step", -1))
