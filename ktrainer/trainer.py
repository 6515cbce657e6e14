"""The Trainer: its arguments, fit/validate/test/predict, and the training loop, top to bottom."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import numpy as np

from ktrainer.backends import make_engine, plan_devices
from ktrainer.callbacks import Callback, ModelCheckpoint
from ktrainer.callbacks.keras_adapter import KerasCallback
from ktrainer.checkpoint.format import checkpoint_name
from ktrainer.checkpoint.resume import Resumable, check_ckpt_path, find_checkpoint
from ktrainer.checkpoint.variables import assign_all, keyed, mismatches, refuse_mismatches
from ktrainer.checks import (
    check_bool,
    check_choice,
    check_count_or_fraction,
    check_fast_dev_run,
    check_int,
    check_module_hooks,
    check_path,
    check_storage_options,
    defines_hook,
    optional,
)
from ktrainer.components import adopt_class_keys, check_checkpoint_dirs, check_global_batch, check_keys, unique_keys
from ktrainer.data import BatchSource, batches_per_epoch, check_validation_split, split_for_validation
from ktrainer.defaults import default_callbacks, resolve_loggers
from ktrainer.fs import Location
from ktrainer.history import History
from ktrainer.loggers import Logger
from ktrainer.logs import quietly, show_events
from ktrainer.loop_state import TrainerState
from ktrainer.lr_scaling import LR_SCALINGS, scale_learning_rate
from ktrainer.metrics import EpochMetrics, hook_values, metric_object_values, reset_metric_objects
from ktrainer.module import Module
from ktrainer.module_checks import (
    check_layers_created_in_build,
    check_training_steps,
    warn_val_data_without_validation_step,
)
from ktrainer.precision import LayerPrecision, resolve_precision
from ktrainer.precision.advice import hardware_advice
from ktrainer.precision.float32_layers import float32_at_construction, keep_float32
from ktrainer.precision.report import (
    check_output_dtype,
    output_dtypes,
    precision_report,
)
from ktrainer.preemption import DEFAULT_SIGNALS, Preempted, SignalWatcher, check_signals
from ktrainer.progress import Progress, draw_seed
from ktrainer.random_state import capture_random_state, restore_random_state
from ktrainer.run import RunIdentity
from ktrainer.run_summary import fit_summary, stop_line, stop_reason
from ktrainer.schedule import Schedule
from ktrainer.step_outputs import APPLIED, LOSS_SCALE, SKIPPED, STOP
from ktrainer.tracing import warn_if_not_training, watch_calls

__all__ = ["Trainer"]

log = logging.getLogger("ktrainer")

_DEFAULT_MAX_EPOCHS = 1000
SKIPPED_STEPS = "precision/skipped_steps"


class Trainer:
    """Runs a `Module`: precision, devices, data, the loop, logging and callbacks.

    All arguments are keyword-only and checked here, before anything is built or written.

    Args:
        max_epochs: Stop after this many epochs. With neither `max_epochs` nor `max_steps`,
            1000 (with a warning), as in Lightning.
        max_steps: Stop after this many optimizer steps.
        batch_size: Examples per device per step; the global batch is this times the replicas.
        precision: "32-true" (alias "32"), "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true"
            (alias "64"), or a `Precision` plugin such as `MixedPrecision("16-mixed", initial_scale=...)`.
        float32_layers: Layer classes or names that compute in float32 whatever the precision
            (e.g. `[keras.layers.BatchNormalization]`), when accuracy suffers without NaN.
        accelerator: "auto" (TPU if present, else GPU, else CPU), "cpu", "gpu" or "tpu".
        devices: "auto" (every GPU, else one CPU), a count, or a list of device indices. On a machine
            without GPUs, `devices=N` splits the CPU into N logical devices.
        strategy: "auto", "one_device", "mirrored", "multi_worker", "tpu", or a tf.distribute.Strategy.
        num_nodes: Worker processes; more than 1 (or a TF_CONFIG cluster) uses MultiWorkerMirroredStrategy.
        lr_scaling: None (never change the learning rate), "sqrt" or "linear": scale the rate written
            for one replica by the square root of, or by, the number of replicas.
        limit_train_batches: Batches per training epoch: an int, or a float fraction of the epoch.
        limit_val_batches: Batches per validation: an int (0 turns validation off) or a fraction.
        val_check_interval: Validate every N training batches (int) or every fraction of an
            epoch (float); None: at epoch ends only.
        check_val_every_n_epoch: Validate at the end of every N-th epoch; None: not at epoch ends.
        log_every_n_steps: Log step metrics every N optimizer steps.
        gradient_clip_val: Clip gradients to this global norm; None: no clipping.
        accumulate_grad_batches: Average the gradients of this many batches per optimizer step.
        steps_per_execution: Batches run inside one compiled call (less Python overhead).
        seed: Seeds python, numpy, tensorflow and keras at the start of `fit`, and the
            per-epoch shuffle of numpy data; None draws a shuffle seed and seeds nothing.
        fast_dev_run: True (or N) runs 1 (or N) training and validation batches, one epoch,
            without loggers or checkpoints: a quick check that everything runs.
        default_root_dir: Where logs (and checkpoints) go: a local path or any fsspec URL.
        storage_options: fsspec options for `default_root_dir` (credentials, endpoint).
        callbacks: Callbacks, called in the given order after the built-in ones.
        logger: True (a TensorBoardLogger), False/None, a Logger, or a list of Loggers.
        enable_progress_bar: Show the progress bar.
        enable_checkpointing: Add a default ModelCheckpoint (unless one is among the callbacks).
        preemption_signals: Signals that stop fit cleanly: finish the step, save a checkpoint, run
            the hooks, close the loggers, raise `Preempted` (exit status 128 + signal). Default
            SIGTERM (spot VMs, Kubernetes) and SIGUSR1 (SLURM's --signal); None: not watched.
        allow_global_batch_change: Let a run resume a checkpoint saved with another global batch
            size (other devices or batch_size); the data position is carried over in examples.

    Raises:
        ValueError: For any argument value that is not supported, naming the allowed ones.
    """

    def __init__(
        self,
        *,
        max_epochs: int | None = None,
        max_steps: int | None = None,
        batch_size: int = 32,
        precision: Any = "32-true",
        float32_layers: Sequence[type | str] | None = None,
        accelerator: str = "auto",
        devices: Any = "auto",
        strategy: Any = "auto",
        num_nodes: int = 1,
        lr_scaling: str | None = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        log_every_n_steps: int = 50,
        gradient_clip_val: float | None = None,
        accumulate_grad_batches: int = 1,
        steps_per_execution: int = 1,
        seed: int | None = None,
        fast_dev_run: bool | int = False,
        default_root_dir: str = ".",
        storage_options: dict[str, Any] | None = None,
        callbacks: Sequence[Callback] | None = None,
        logger: bool | Logger | Sequence[Logger] | None = True,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        preemption_signals: Sequence[str | int] | None = DEFAULT_SIGNALS,
        allow_global_batch_change: bool = False,
    ) -> None:
        show_events()
        self.max_steps = check_int("max_steps", max_steps, minimum=1, allow_none=True)
        self.max_epochs = check_int("max_epochs", max_epochs, minimum=1, allow_none=True)
        if max_epochs is None and max_steps is None:
            self.max_epochs = _DEFAULT_MAX_EPOCHS
            log.warning("Neither max_epochs nor max_steps is set: training stops after max_epochs=%d. Set one of "
                        "them to say when the run ends.", _DEFAULT_MAX_EPOCHS)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.precision = resolve_precision(precision)
        self.float32_layers = list(float32_layers or [])
        for selector in self.float32_layers:
            if not isinstance(selector, str | type):
                raise ValueError(f"float32_layers takes layer classes or layer names, got {selector!r}.")
        self.lr_scaling = check_choice("lr_scaling", lr_scaling, LR_SCALINGS)
        self.plan = plan_devices(accelerator, devices, strategy, num_nodes)
        self.engine = make_engine(self.plan)
        self.limit_train_batches = optional(check_count_or_fraction, "limit_train_batches", limit_train_batches)
        self.limit_val_batches = optional(check_count_or_fraction, "limit_val_batches", limit_val_batches,
                                           allow_zero=True)
        self.val_check_interval = optional(check_count_or_fraction, "val_check_interval", val_check_interval)
        self.check_val_every_n_epoch = check_int("check_val_every_n_epoch", check_val_every_n_epoch,
                                                 minimum=1, allow_none=True)
        self.log_every_n_steps = check_int("log_every_n_steps", log_every_n_steps, minimum=1)
        if gradient_clip_val is not None and not (isinstance(gradient_clip_val, int | float)
                                                  and gradient_clip_val > 0):
            raise ValueError(f"gradient_clip_val must be a number > 0 or None, got {gradient_clip_val!r}.")
        self.gradient_clip_val = gradient_clip_val
        self.accumulate_grad_batches = check_int("accumulate_grad_batches", accumulate_grad_batches, minimum=1)
        self.steps_per_execution = check_int("steps_per_execution", steps_per_execution, minimum=1)
        self.seed = check_int("seed", seed, minimum=0, allow_none=True)
        self.fast_dev_run = check_fast_dev_run(fast_dev_run)
        self.default_root_dir = check_path("default_root_dir", default_root_dir)
        self.storage_options = check_storage_options("storage_options", storage_options)
        self.enable_checkpointing = check_bool("enable_checkpointing", enable_checkpointing)
        self.preemption_signals = check_signals(preemption_signals)
        self.allow_global_batch_change = check_bool("allow_global_batch_change", allow_global_batch_change)
        if self.fast_dev_run:
            n = self.fast_dev_run
            self.max_epochs, self.max_steps = 1, None
            self.limit_train_batches = self.limit_val_batches = n
            self.val_check_interval, self.check_val_every_n_epoch = None, 1
            logger, self.enable_checkpointing = False, False
        self.loggers = resolve_loggers(logger)
        self.callbacks = default_callbacks(callbacks, enable_progress_bar, bool(self.loggers),
                                            self.enable_checkpointing)
        for each in self.loggers:
            each.attach(self.default_root_dir, self.storage_options)
        check_checkpoint_dirs(self.callbacks, self.default_root_dir, self.storage_options)

        self.progress = Progress(shuffle_seed=self.seed if self.seed is not None else draw_seed())
        self.schedule: Schedule | None = None  # when fit validates, logs and stops; made by fit
        self.run = RunIdentity()
        self.should_stop = False
        self.stop_reason: str | None = None  # why a callback set should_stop, for the end-of-fit line
        self.callback_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}
        self.progress_bar_metrics: dict[str, float] = {}
        self.num_training_batches: int | None = None
        self.estimated_training_batches: int | None = None  # for display: also for data of unknown exact length
        self.eval_results: dict[str, float] = {}  # what the last validate()/test() returned
        self.optimizer: keras.optimizers.Optimizer | None = None
        self.optimizers: list[keras.optimizers.Optimizer] = []
        self._configured: list[keras.optimizers.Optimizer] = []
        self.lr_factor = 1.0
        self._module: Module | None = None
        self.state = TrainerState()
        self._train_step: Any = None
        self._signals = SignalWatcher(())
        self.history = History()
        self.shuffle = True
        self._epoch_record: dict[str, float] = {}

    # ----- public API -----------------------------------------------------------------

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (skipped ones included): `progress.global_step`."""
        return self.progress.global_step

    @property
    def current_epoch(self) -> int:
        """The current epoch, 0-based (after fit: the number of epochs completed): `progress.epoch`."""
        return self.progress.epoch

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for non-finite gradients under loss scaling: `progress.skipped_steps`."""
        return self.progress.skipped_steps

    @property
    def logger(self) -> Logger | None:
        """The first logger, or None."""
        return self.loggers[0] if self.loggers else None

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first ModelCheckpoint among the callbacks, or None."""
        return next((c for c in self.callbacks if isinstance(c, ModelCheckpoint)), None)

    @property
    def is_global_zero(self) -> bool:
        """True in the process that writes logs and checkpoints (the chief; always with one process)."""
        return self.plan.is_chief

    @property
    def num_replicas(self) -> int:
        """Replicas a global batch is split over (devices of all processes)."""
        return self.engine.replicas

    @property
    def strategy(self) -> Any:
        """The tf.distribute strategy on TensorFlow (None before the first fit/validate/test/predict); the
        keras.distribution Distribution on JAX (None on one device)."""
        return self.engine.strategy

    @property
    def global_batch_size(self) -> int:
        """Examples per step across all replicas: `batch_size` x replicas in sync."""
        return self.batch_size * self.engine.replicas

    @property
    def checkpoint_dir(self) -> Location:
        """Where `ckpt_path="last"`/`"best"` look: the first ModelCheckpoint's dirpath, else `{root}/checkpoints`."""
        callback = self.checkpoint_callback
        if callback is not None:
            return callback.resolve_location(self.default_root_dir, self.storage_options)
        return Location(f"{self.default_root_dir.rstrip('/')}/checkpoints", self.storage_options)

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds to continue this run exactly, by section.

        Sections: "model" and "optimizer" (every variable, by "index:path"; the live variables,
        read when written), "accumulation" (a partial gradient-accumulation group), "progress",
        "random", "callbacks" and "loggers" (each one's state_dict by its unique key),
        "precision", and "run" (id, lineage, global batch size, precision, hyperparameters).

        Raises:
            RuntimeError: Before the model and optimizer are built (inside fit).
        """
        module = self._module
        if module is None or module.model is None or self.optimizer is None or self._train_step is None:
            raise RuntimeError("Trainer.state_dict() needs a built model and optimizer: call it during fit "
                               "(e.g. from a callback).")
        self.engine.sync()
        return {
            "model": keyed(module.model.variables),
            "optimizer": keyed(self._optimizer_variables()),
            "accumulation": self._train_step.state_dict(),
            "progress": self.progress.state_dict(),
            "random": capture_random_state(),
            "callbacks": {key: cb.state_dict() for key, cb in unique_keys(self.callbacks).items()},
            "loggers": {key: lg.state_dict() for key, lg in unique_keys(self._writing_loggers()).items()},
            "precision": self.precision.state_dict(),
            "metrics": {name: list(metric.variables)
                        for name, metric in module._metric_objects.get("train", {}).items()},
            "run": {"run_id": self.run.run_id, "lineage": list(self.run.lineage), "parent": self.run.parent,
                    "global_batch_size": self.global_batch_size, "precision": self.precision.name,
                    "hparams": _jsonable(module.hparams), "shuffle": self.shuffle},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what `state_dict()` returned (a checkpoint's state): everything, or nothing.

        Every check runs before anything is loaded: the variables must match the model's and
        optimizer's (names and shapes), and the global batch size the saved one (unless
        `allow_global_batch_change`). Callbacks and loggers are matched by key; a key on one side
        only is named in a warning.

        Raises:
            ValueError: When the checkpoint does not fit this model, optimizer or global batch.
        """
        module = self._module
        problems = (mismatches("model", state["model"], module.model.variables)
                    + mismatches("optimizer", state["optimizer"], self._optimizer_variables()))
        accumulation = self._train_step.mismatch(state.get("accumulation", {}))
        if accumulation:
            problems.append(accumulation)
        refuse_mismatches(problems, "this model and optimizer")
        progress = check_global_batch(state["progress"], state["run"]["global_batch_size"], self.global_batch_size,
                                      self.allow_global_batch_change)
        callbacks = unique_keys(self.callbacks)
        loggers = unique_keys(self._writing_loggers())
        saved = {"callbacks": adopt_class_keys(state.get("callbacks", {}), callbacks),
                 "loggers": adopt_class_keys(state.get("loggers", {}), loggers)}
        check_keys("callbacks", saved["callbacks"], callbacks)
        if self.is_global_zero:
            check_keys("loggers", saved["loggers"], loggers)
        assign_all(state["model"], module.model.variables)
        assign_all(state["optimizer"], self._optimizer_variables())
        self._train_step.load_state_dict(state.get("accumulation", {}))
        self.progress.load_state_dict(progress)
        for section, components in (("callbacks", callbacks), ("loggers", loggers)):
            for key, component in components.items():
                if key in saved[section]:
                    component.load_state_dict(saved[section][key])
        self.precision.load_state_dict(state.get("precision", {}))
        for name, metric in module._metric_objects.get("train", {}).items():
            saved_metric = state.get("metrics", {}).get(name)
            if saved_metric is not None and len(saved_metric) == len(metric.variables):
                for variable, value in zip(metric.variables, saved_metric, strict=True):
                    variable.assign(value)
        restore_random_state(state["random"])
        self.engine.reload()
        if state["run"]["precision"] != self.precision.name:
            log.warning("Resuming a %s checkpoint under precision=%r.", state["run"]["precision"], self.precision.name)

    def _optimizer_variables(self) -> list:
        """Every optimizer's variables, in `configure_optimizers` order."""
        return [variable for optimizer in self.optimizers for variable in optimizer.variables]

    def save_checkpoint(self) -> list[str]:
        """Save a checkpoint now through every ModelCheckpoint, and wait until it is committed.

        Returns:
            The URLs of the checkpoints saved (empty outside the chief, or without a ModelCheckpoint).
        """
        return self._save_checkpoints("manual")

    def _save_checkpoints(self, reason: str) -> list[str]:
        saved = []
        for callback in self.callbacks:
            if isinstance(callback, ModelCheckpoint):
                callback.save(self, reason=reason)
                callback.wait()
                if callback.last_saved:
                    saved.append(callback.last_saved)
        return saved

    def precision_report(self, module: Module | None = None) -> dict[str, LayerPrecision]:
        """Compute and variable dtype of every layer of the module's model, by layer name.

        Args:
            module: The module; default: the one of the last fit/validate/test/predict call.

        Returns:
            {layer name: LayerPrecision(class_name, compute_dtype, variable_dtype)}.

        Raises:
            RuntimeError: If the module's model is not built yet.
        """
        module = module or self._module
        if module is None or module.model is None:
            raise RuntimeError("precision_report() needs a built model: call it after trainer.fit(module) "
                               "(or validate/test/predict), or pass the module.")
        return precision_report(module.model)

    def fit(self, module: Module, train_data: Any = None, val_data: Any = None,
            ckpt_path: str | os.PathLike | None = None, shuffle: bool | None = None,
            validation_split: float | None = None) -> History:
        """Train `module`: build it, then run epochs of training (and validation) until a limit.

        Args:
            module: The Module to train.
            train_data: Training data; None: `module.train_data()`.
            val_data: Validation data; None: `module.val_data()` (None there: no validation).
            ckpt_path: Resume from "last" (the most recently committed checkpoint under the run's
                checkpoint directory), "best" (by the monitor its manifests record), or a
                checkpoint's path or URI: the run continues as if it had never stopped.
            shuffle: Shuffle numpy training data each epoch (Keras's name). None: True, or what
                the checkpoint resumed from was trained with (a checkpoint keeps it).
            validation_split: A fraction between 0 and 1: the last part of numpy training data,
                taken before shuffling, validates instead of training (Keras's name and meaning).

        Returns:
            A `History` of this call's epochs (`history.history["val/loss"]`, ...).

        Raises:
            TypeError: If the module lacks a required hook.
            ValueError: If an argument is wrong, there is no training data, or the checkpoint does
                not fit (nothing is loaded).
            CheckpointError: If `ckpt_path` names no valid checkpoint.
            Preempted: After a preemption signal, once a checkpoint is saved (a SystemExit).
        """
        check_module_hooks(module, Module, ("build", "configure_optimizers", "training_step"))
        ckpt_path = check_ckpt_path(ckpt_path)
        if shuffle is not None:
            check_bool("shuffle", shuffle)
        check_validation_split(validation_split, val_data)
        self.run = RunIdentity()
        self.history = History()
        with self._run("fit", module), SignalWatcher(self.preemption_signals) as self._signals:
            resumed = find_checkpoint(ckpt_path, self.checkpoint_dir, self.storage_options) if ckpt_path else None
            if resumed is not None and not self.allow_global_batch_change:  # fail before building anything
                check_global_batch(resumed.state["progress"], resumed.state["run"]["global_batch_size"],
                                   self.global_batch_size, allow_change=False)
            self.shuffle = _shuffle_setting(shuffle, resumed)
            if validation_split is not None:
                train_data, val_data = self._split(module, train_data, validation_split)
            train = self._source(train_data, module.train_data, "train_data", training=True, required=True)
            self.num_training_batches = batches_per_epoch(train, self.limit_train_batches)
            self.estimated_training_batches = train.estimated_batches
            check_training_steps(self.num_training_batches, train.num_examples, self.batch_size,
                                 self.engine.replicas)
            self.schedule = Schedule(
                self.max_epochs, self.max_steps, self.num_training_batches, self.steps_per_execution,
                self.accumulate_grad_batches, self.val_check_interval, self.check_val_every_n_epoch,
                self.log_every_n_steps, whole_groups=self.engine.multi_process)
            val = None
            if self.limit_val_batches != 0:
                val = self._source(val_data, module.val_data, "val_data", training=False, required=False)
                if val is not None and not warn_val_data_without_validation_step(module, Module):
                    val = None
            self._build(module, with_optimizer=True)
            train_step = self._train_step = self.engine.train_step(
                module, self.optimizers, self._configured, self.precision, gradient_clip_val=self.gradient_clip_val,
                accumulate_grad_batches=self.accumulate_grad_batches)
            with watch_calls(module.model) as calls:
                keys = self.engine.prepare_train_step(train_step, train)
            warn_if_not_training(calls)
            if not getattr(module.model, "outputs", None):  # a subclassed model: its calls showed the dtypes
                check_output_dtype(calls.output_dtypes, self.precision.name, self.precision.compute_dtype)
            if resumed is not None:
                self._resume(resumed)
            train_runner = self.engine.train_runner(train_step, keys)
            val_runner = self.engine.eval_runner(module, val, "validation_step", "val") if val else None
            self._val_batches = batches_per_epoch(val, self.limit_val_batches) if val else None
            if self.is_global_zero:
                log.info(fit_summary(self, module, train, val, resumed))
            self._log_hyperparameters(module)
            self._call("on_fit_start", module)
            if self._finished():
                log.warning("Nothing to train: the run is at step %d (epoch %d): %s. Raise the limit to train on.",
                            self.global_step, self.current_epoch, stop_reason(self))
            started = time.monotonic()
            try:
                while not self._finished():
                    self._check_for_preemption()
                    self._train_epoch(module, train, train_step, train_runner, val, val_runner)
            except _PreemptionRequested as request:
                self._stop_for_preemption(request.signum)
            self.engine.sync()
            self._call("on_train_end", module)
            if self.is_global_zero:
                log.info(stop_line(self, time.monotonic() - started))
            self._finalize_ema()
            self._call("on_fit_end", module)
        return self.history

    def _finalize_ema(self) -> None:
        """Put the moving averages into the weights, as Keras's fit does for an optimizer with `use_ema=True`.

        After `on_train_end`, where the last checkpoint (raw weights and averages both, for an exact
        resume) is saved; `on_fit_end` hooks and the caller see the averaged weights.
        """
        for rule in self._train_step.rules:
            inner = getattr(rule.optimizer, "inner_optimizer", rule.optimizer)
            if getattr(inner, "use_ema", False):
                self.engine.sync()
                inner.finalize_variable_values(rule.variables)
                self.engine.reload()

    def _resume(self, resumed: Resumable) -> None:
        """Load a checkpoint into the built run (all or nothing) and note where the run continues from."""
        self.load_state_dict(resumed.state)
        saved_run = resumed.state["run"]
        self.run = self.run.resumed(resumed.canonical_url, resumed.info.committed, saved_run.get("lineage", []))
        log.debug("Resumed from %s at step %d (epoch %d, batch %d).", resumed.info.url, self.global_step,
                  self.current_epoch, self.progress.batch_in_epoch)

    def _stop_for_preemption(self, signum: int) -> None:
        """Save a checkpoint at the step reached (waiting for a save in flight), then raise Preempted."""
        callback = self.checkpoint_callback
        if self.is_global_zero:
            saved = self._save_checkpoints("preemption") or ([callback.last_saved] if callback and callback.last_saved
                                                             else [])
        else:  # the chief saves, at the same step (every worker stopped after the same one)
            saved = [f"{self.checkpoint_dir.url.rstrip('/')}/{checkpoint_name(self.global_step)}"] if callback else []
        preempted = Preempted(signum, self.global_step, saved[0] if saved else None)
        log.warning("%s Resume with ckpt_path='last'.", preempted)
        raise preempted

    def validate(self, module: Module, data: Any = None, ckpt_path: str | os.PathLike | None = None,
                 ) -> dict[str, float]:
        """Run `module.validation_step` over the validation data.

        Args:
            module: The Module (built here if it was not trained in this process).
            data: Validation data; None: `module.val_data()`.
            ckpt_path: Validate the model weights of a checkpoint: "last", "best" or a checkpoint's
                path or URI (as in `fit`); None: the module's current weights.

        Returns:
            The epoch metrics, e.g. {"val/loss": 0.31, "val/acc": 0.92}.
        """
        return self._evaluate(module, data, "validation_step", "val", "validate", ckpt_path)

    def test(self, module: Module, data: Any = None, ckpt_path: str | os.PathLike | None = None) -> dict[str, float]:
        """Run `module.test_step` over the test data.

        Args:
            module: The Module.
            data: Test data; None: `module.test_data()`.
            ckpt_path: Test the model weights of a checkpoint ("last", "best", a path or URI); None:
                the module's current weights.

        Returns:
            The epoch metrics, e.g. {"test/loss": 0.33}.
        """
        return self._evaluate(module, data, "test_step", "test", "test", ckpt_path)

    def predict(self, module: Module, data: Any = None) -> Any:
        """Run `module.predict_step` over the data and concatenate the results.

        Args:
            module: The Module.
            data: Data to predict on; None: `module.predict_data()`. Tuples are taken as
                `(x, ...)` by the default predict_step.

        Returns:
            A numpy array (or a structure of arrays, as predict_step returns), one row per example.
        """
        check_module_hooks(module, Module, ("build",))
        with self._run("predict", module):
            source = self._source(data, module.predict_data, "predict data", training=False, required=True)
            self._build(module, with_optimizer=False)
            self._call("on_predict_start", module)
            chunks = self.engine.predict(module, source)
            self._call("on_predict_end", module)
        return keras.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *chunks)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Send metrics to every logger (and to `callback_metrics`), at `step` or the global step."""
        step = self.global_step if step is None else step
        self.logged_metrics.update(metrics)
        self.callback_metrics.update(metrics)
        for each in self._writing_loggers():
            each.log_metrics({**metrics, "epoch": self.current_epoch}, step)

    # ----- the training loop ------------------------------------------------------------

    def _train_epoch(self, module: Module, train: BatchSource, train_step: Any,
                     runner: Any, val: BatchSource | None, val_runner: Any) -> None:
        progress = self.progress
        self.state.at_epoch_end = self.state.validated_this_epoch = False
        self.state.first_batch_of_epoch = progress.batch_in_epoch
        if progress.batch_in_epoch == 0:
            reset_metric_objects(module, "train")  # resumed mid-epoch, they hold the checkpoint's state
        progress.start_epoch()
        self._epoch_record = {}
        module._stage = "train"
        module.on_train_epoch_start()
        self._call("on_train_epoch_start", module)
        self._log_hook_values(module)
        metrics = EpochMetrics(module._log_options, progress.epoch_sums)
        if progress.pending_validation and val is not None:
            self._validate_in_fit(module, val, val_runner)
        iterator = self.engine.batches(train, progress.epoch, progress.batch_in_epoch, progress.shuffle_seed)
        sync_each_batch = self._batch_hooks_read_weights(module)
        exhausted = False
        while not self.should_stop:
            num_steps = self.schedule.batches_in_next_execution(progress)
            if num_steps == 0:
                break
            self._call("on_train_batch_start", module, progress.batch_in_epoch)
            if self.engine.multi_process and self._signals.received is not None:
                self.engine.request_stop(train_step)  # every process learns it from this execution's all-reduce
            outputs = runner.run(iterator, num_steps, progress.batch_in_epoch)
            ran = len(outputs[APPLIED])
            if ran == 0:
                if progress.batch_in_epoch == 0:
                    check_training_steps(0, None, self.batch_size, self.engine.replicas)
                exhausted = True
                break
            metrics.add(outputs)
            stepped = outputs[APPLIED].astype(bool)
            steps_after = progress.global_step + np.cumsum(stepped)
            skips_after = progress.skipped_steps + np.cumsum(outputs[SKIPPED].astype(np.int64))
            log_at = self.schedule.log_indices(stepped, steps_after)
            running = metric_object_values(module, "train", epoch=False)  # their result after this execution
            for index in log_at:
                progress.global_step = int(steps_after[index])
                extra = {SKIPPED_STEPS: int(skips_after[index])} if self.precision.loss_scaling else {}
                self.log_metrics({**metrics.step_metrics(outputs, index), **running, **extra})
            self.state.logged_step_in_last_execution = len(log_at) > 0
            progress.global_step = int(steps_after[-1])
            progress.skipped_steps = int(skips_after[-1])
            progress.batch_in_epoch += ran
            scale = outputs.get(LOSS_SCALE)
            self.precision.watch(outputs[SKIPPED][stepped], None if scale is None else float(scale[-1]))
            step_metrics = {**metrics.step_metrics(outputs, ran - 1), **running}
            self._remember(step_metrics, metrics)
            if sync_each_batch:
                self.engine.sync()
            self._call("on_train_batch_end", module, step_metrics, progress.batch_in_epoch - 1)
            self._check_for_preemption(outputs)
            if val is not None and self.schedule.validates_within_epoch(progress):
                self._validate_in_fit(module, val, val_runner)
            if ran < num_steps:
                exhausted = True
                break
            if self.max_steps is not None and progress.global_step >= self.max_steps:
                break
        epoch_ended = exhausted or (self.num_training_batches is not None
                                    and progress.batch_in_epoch >= self.num_training_batches)
        if epoch_ended:
            stepped, skipped = train_step.flush()
            progress.global_step += int(stepped)
            progress.skipped_steps += int(skipped)
        self.state.at_epoch_end = True
        self.engine.sync()
        if val is not None and self.schedule.validates_at_epoch_end(progress):
            self._validate_in_fit(module, val, val_runner)
        epoch_values = {**metrics.epoch_metrics(), **metric_object_values(module, "train", epoch=True)}
        self.log_metrics(epoch_values)
        self._remember(epoch_values, metrics)
        self._epoch_record.update(epoch_values)
        progress.epoch_done = epoch_ended
        module._stage = "train"
        module.on_train_epoch_end()
        self._call("on_train_epoch_end", module)
        self._log_hook_values(module)
        if epoch_ended:
            self.history.record(progress.epoch, self._epoch_record)
        for each in self._writing_loggers():
            each.flush()
        train.end_epoch()
        if epoch_ended:
            progress.next_epoch()

    def _finished(self) -> bool:
        return self.should_stop or self.schedule.finished(self.progress)

    def _check_for_preemption(self, outputs: dict[str, np.ndarray] | None = None) -> None:
        """Stop here when a preemption signal arrived.

        With several workers the decision is the one every worker read from the last training
        execution's all-reduce (`outputs`), so all stop after the same step and none waits
        forever in a collective; elsewhere (between epochs, during validation) they go on.
        """
        received = self._signals.received
        if self._train_step is None or not self.engine.multi_process:
            if received is not None:
                raise _PreemptionRequested(received)
        elif outputs is not None and outputs[STOP][-1] > 0:
            raise _PreemptionRequested(received if received is not None else signal.SIGTERM)

    # ----- validation -------------------------------------------------------------------

    def _validate_in_fit(self, module: Module, val: BatchSource, runner: Any) -> None:
        """A validation run inside fit. Preempted part-way, it is marked pending, and a resumed run repeats it
        (at an epoch end, the whole epoch end is repeated: the epoch is not marked done until it ran)."""
        self.progress.pending_validation = not self.state.at_epoch_end
        self.engine.sync()
        self._call("on_validation_start", module)
        metrics = self._run_eval(module, val, runner, self._val_batches, "val", preemptible=True)
        self.progress.pending_validation = False
        self.log_metrics(metrics)
        if self.state.at_epoch_end:
            self._epoch_record.update(metrics)
        self.state.validated_this_epoch = self.state.at_epoch_end
        self._call("on_validation_end", module)

    def _evaluate(self, module: Module, data: Any, hook: str, prefix: str, stage: str,
                  ckpt_path: str | os.PathLike | None) -> dict[str, float]:
        check_module_hooks(module, Module, ("build",))
        ckpt_path = check_ckpt_path(ckpt_path)
        kind = "validation" if prefix == "val" else "test"
        with self._run(stage, module):
            source = self._source(data, getattr(module, f"{prefix}_data"), f"{prefix}_data",
                                  training=False, required=True)
            self._build(module, with_optimizer=False)
            limit = self.limit_val_batches if prefix == "val" else None
            runner = self.engine.eval_runner(module, source, hook, prefix)  # a subclassed model is built by now
            if ckpt_path:
                self._load_model_weights(module, ckpt_path)
            self._call(f"on_{kind}_start", module)
            metrics = self._run_eval(module, source, runner, batches_per_epoch(source, limit), prefix)
            self.log_metrics(metrics)
            self.eval_results = metrics
            self._call(f"on_{kind}_end", module)
        return metrics

    def _load_model_weights(self, module: Module, ckpt_path: str) -> None:
        """The model weights of a checkpoint, for validate/test (the optimizer and the run are not touched)."""
        resumed = find_checkpoint(ckpt_path, self.checkpoint_dir, self.storage_options)
        if resumed is None:
            raise ValueError(f"ckpt_path={ckpt_path!r}: there is no checkpoint under {self.checkpoint_dir.url} yet.")
        refuse_mismatches(mismatches("model", resumed.state["model"], module.model.variables), "this model")
        assign_all(resumed.state["model"], module.model.variables)
        log.info("Evaluating the weights of %s (step %d).", resumed.info.url, resumed.state["progress"]["global_step"])

    def _run_eval(self, module: Module, source: BatchSource, runner: Any,
                  num_batches: int | None, stage: str, *, preemptible: bool = False) -> dict[str, float]:
        """One evaluation run: reset its metric objects, the epoch hooks around the batches, exact results."""
        kind = "validation" if stage == "val" else "test"
        reset_metric_objects(module, stage)
        module._stage = stage
        getattr(module, f"on_{kind}_epoch_start")()
        self._call(f"on_{kind}_epoch_start", module)
        metrics = EpochMetrics(module._log_options)
        iterator = self.engine.batches(source)
        while num_batches is None or metrics.steps < num_batches:
            if preemptible:
                self._check_for_preemption()
            wanted = self.steps_per_execution
            if num_batches is not None:
                wanted = min(wanted, num_batches - metrics.steps)
            outputs = runner.run(iterator, wanted, metrics.steps)
            if len(next(iter(outputs.values()))):
                metrics.add(outputs)
            if len(next(iter(outputs.values()))) < wanted:
                break
        results = {**metrics.epoch_metrics(), **metric_object_values(module, stage, epoch=True)}
        module._stage = stage
        getattr(module, f"on_{kind}_epoch_end")()
        self._call(f"on_{kind}_epoch_end", module)
        results.update(hook_values(module._take_logged()))
        self._remember(results, metrics)
        return results

    def _log_hook_values(self, module: Module) -> None:
        """Log what the module logged from a Python hook (numbers), at once, at the current step."""
        values = hook_values(module._take_logged())
        if values:
            self.log_metrics(values)
            self.callback_metrics.update(values)
            self._epoch_record.update(values)

    # ----- set-up and tear-down ---------------------------------------------------------

    @contextlib.contextmanager
    def _run(self, stage: str, module: Module) -> Iterator[None]:
        """Everything around one fit/validate/test/predict call, including the error path."""
        previous_policy = keras.config.dtype_policy()
        self.state = TrainerState(stage=stage)
        self.should_stop, self.stop_reason = False, None
        module.trainer = self
        self._module = module
        status = "success"
        stack = contextlib.ExitStack()
        try:
            self.engine.start()
            if stage == "fit":
                self.precision.reset()
                if self.seed is not None:
                    keras.utils.set_random_seed(self.seed)
            module.setup(stage)
            self._call("setup", module, stage)
            yield
        except BaseException as error:
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            for callback in self.callbacks:
                quietly(callback.on_exception, self, module, error)
            raise
        finally:
            try:
                for each in self._writing_loggers():
                    if status == "success":
                        each.finalize(status)
                    else:
                        quietly(each.finalize, status)
                for callback in self.callbacks:
                    quietly(callback.teardown, self, module, stage)
                quietly(module.teardown, stage)
            finally:
                quietly(self.engine.sync)
                stack.close()
                keras.config.set_dtype_policy(previous_policy)
                self.state.stage = ""

    def _build(self, module: Module, *, with_optimizer: bool) -> None:
        """Set the precision policy, enter the strategy scope, build the model (and optimizer)."""
        check_layers_created_in_build(module)
        keras.config.set_dtype_policy(self.precision.policy)
        with self.engine.scope():
            if module.model is None:
                with float32_at_construction(self.float32_layers) as matched:
                    model = module.build()
                if not isinstance(model, keras.Model):
                    raise TypeError(
                        f"{type(module).__name__}.build() returned {type(model).__name__}; it must return "
                        "a keras.Model (e.g. keras.Sequential([...]))."
                    )
                module.model = module._built_model = model
                unmatched = [s for s in self.float32_layers if s not in matched]
                if unmatched:  # names Keras gave: known only now
                    keep_float32(model, unmatched)
            if with_optimizer:
                configured = module.configure_optimizers()
                self._configured = configured_optimizers(configured, module)
                module._configured_optimizers = configured
                self.optimizers = [self.precision.wrap_optimizer(each) for each in self._configured]
                self.optimizer = self.optimizers[0]
                for each in self.optimizers:
                    self.lr_factor = scale_learning_rate(each, self.lr_scaling, self.engine.replicas)
        dtypes, layer = output_dtypes(module.model)
        check_output_dtype(dtypes, self.precision.name, self.precision.compute_dtype, layer)
        if with_optimizer:
            accelerators = self.engine.visible_accelerators()
            for line in hardware_advice(self.precision.name, self.precision.compute_dtype, accelerators):
                log.warning(line)

    @staticmethod
    def _split(module: Module, train_data: Any, fraction: float) -> tuple[Any, Any]:
        """`validation_split`: the given (or the module's) training data, split; a module's own validation data
        alongside it is an error, as two sources of validation data would be a surprise."""
        if module.val_data() is not None:
            raise ValueError(f"validation_split={fraction} and {type(module).__name__}.val_data() both give "
                             "validation data. Use one: drop validation_split, or return None from val_data().")
        data = train_data if train_data is not None else module.train_data()
        if data is None:
            raise ValueError(f"validation_split={fraction} has no training data to split: pass "
                             "trainer.fit(module, train_data=...) or return it from the module's train_data().")
        return split_for_validation(data, fraction)

    def _source(self, given: Any, hook: Any, what: str, *, training: bool, required: bool) -> BatchSource | None:
        data = given if given is not None else hook()
        if data is None:
            if required:
                raise ValueError(
                    f"No {what}: pass it to the Trainer call (e.g. trainer.fit(module, train_data=...)) "
                    f"or return it from the module's {what.split()[0]}() hook."
                )
            return None
        source = BatchSource(data, self.global_batch_size, shuffle=training and self.shuffle, what=what,
                             drop_remainder=training and self.engine.replicas > 1)
        if training and source.is_infinite and not isinstance(self.limit_train_batches, int):
            raise ValueError(
                f"{what} repeats forever, so an epoch never ends. Set limit_train_batches=N "
                "(batches per epoch) on the Trainer."
            )
        return source

    def _log_hyperparameters(self, module: Module) -> None:
        if module.hparams:
            for each in self._writing_loggers():
                each.log_hyperparams(module.hparams)

    def _remember(self, values: dict[str, float], metrics: EpochMetrics) -> None:
        """Keep the latest values for callbacks (under the logged and the plain names) and the bar."""
        self.callback_metrics.update(values)
        for name in values:
            plain = name.removesuffix("_step").removesuffix("_epoch")
            self.callback_metrics[plain] = values[name]
        shown = metrics.prog_bar_names() | {"train/loss_step"}
        for name in shown & set(values):
            label = "loss" if name == "train/loss_step" else name
            self.progress_bar_metrics[label] = values[name]

    def _batch_hooks_read_weights(self, module: Module) -> bool:
        """Whether a user's callback (or a Keras callback) has batch hooks, which may read the weights: the
        engine then syncs its state into the variables before them. ktrainer's own callbacks read none there."""
        def may_read(callback: Callback) -> bool:
            own = type(callback).__module__.startswith("ktrainer.callbacks.")
            if own and not isinstance(callback, KerasCallback):
                return False
            hooks = ("on_train_batch_start", "on_train_batch_end")
            return any(defines_hook(callback, hook, Callback) for hook in hooks)

        return any(may_read(callback) for callback in self.callbacks)

    def _writing_loggers(self) -> list[Logger]:
        return self.loggers if self.is_global_zero else []

    def _call(self, hook: str, module: Module, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, module, *args)


class _PreemptionRequested(Exception):  # noqa: N818 - a signal to unwind the loop, caught by fit
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def configured_optimizers(configured: Any, module: Module) -> list[keras.optimizers.Optimizer]:
    """The optimizers `configure_optimizers()` returned (one, a list or a dict), as a list, checked.

    Raises:
        TypeError: For anything that is not keras optimizers, or several under automatic optimization.
    """
    name = type(module).__name__
    optimizers = list(configured.values()) if isinstance(configured, dict) else (
        list(configured) if isinstance(configured, list | tuple) else [configured])
    if not optimizers or not all(isinstance(each, keras.optimizers.Optimizer) for each in optimizers):
        raise TypeError(f"{name}.configure_optimizers() returned {configured!r}; it must return a keras optimizer, "
                        "e.g. keras.optimizers.Adam(1e-3), or (with manual optimization) a list or dict of them.")
    if len(optimizers) > 1 and module.automatic_optimization:
        raise TypeError(f"{name}.configure_optimizers() returned {len(optimizers)} optimizers, but the Trainer steps "
                        "one by itself. Set automatic_optimization = False in the module and make each update in "
                        "training_step with self.manual_step(loss_fn, optimizer, variables).")
    return optimizers


def _shuffle_setting(given: bool | None, resumed: Resumable | None) -> bool:
    """`fit(shuffle=...)`: as given; else as the checkpoint resumed from was trained; else True."""
    saved = resumed.state["run"].get("shuffle") if resumed is not None else None
    if given is not None and saved is not None and given != saved:
        log.warning("Resuming a run trained with shuffle=%s under shuffle=%s: the data order differs from the "
                    "interrupted run's.", saved, given)
    if given is not None:
        return given
    return True if saved is None else bool(saved)


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, bool | int | float | str | type(None)) else str(v) for k, v in values.items()}
