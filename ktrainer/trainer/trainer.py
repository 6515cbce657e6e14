"""The Trainer: its arguments and public face; fit sets a run up and hands it to the `FitLoop` (fit_loop.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from ktrainer.backends import make_engine, plan_devices
from ktrainer.callbacks import Callback, ModelCheckpoint
from ktrainer.callbacks.callback_list import call_hook
from ktrainer.checkpoint.lineage import RunIdentity
from ktrainer.checkpoint.resume import Resumable, check_ckpt_path, find_checkpoint, load_model_weights
from ktrainer.checks import (
    check_bool,
    check_choice,
    check_count_or_fraction,
    check_fast_dev_run,
    check_int,
    check_module_hooks,
    check_path,
    check_storage_options,
    optional,
)
from ktrainer.data.checks import check_training_steps, check_validation_stream
from ktrainer.data.sources import BatchSource, batches_per_epoch, check_validation_split
from ktrainer.data.stage_data import choose_source, shuffle_setting, split_training_data
from ktrainer.loggers import Logger
from ktrainer.loop.evaluation import HOOK_NAMES, run_evaluation
from ktrainer.loop.fit_loop import FitLoop, save_checkpoints_now
from ktrainer.loop.history import History
from ktrainer.loop.preemption import DEFAULT_SIGNALS, SignalWatcher, check_signals
from ktrainer.loop.reporting import Reporter
from ktrainer.loop.run_clock import RunClock
from ktrainer.loop.run_summary import fit_summary
from ktrainer.loop.trainer_state import TrainerState
from ktrainer.module import Module
from ktrainer.precision import LayerPrecision, resolve_precision
from ktrainer.precision.report import precision_report
from ktrainer.progress import Progress, draw_seed
from ktrainer.schedule import Schedule, check_validation_rhythm
from ktrainer.trainer.building import build_model, build_optimizers
from ktrainer.trainer.call_scope import call_scope
from ktrainer.trainer.defaults import default_callbacks, resolve_loggers
from ktrainer.trainer.lr_scaling import LR_SCALINGS
from ktrainer.trainer.module_checks import warn_val_data_without_validation_step
from ktrainer.trainer.resume_checks import check_checkpoint_dirs, check_global_batch
from ktrainer.trainer.saving import save_checkpoint_at
from ktrainer.trainer.state_dict import load_trainer_state_dict, trainer_state_dict
from ktrainer.trainer.tracing import warn_if_not_training, warn_if_outputs_not_float32, watch_calls
from ktrainer.utils.fs import Location
from ktrainer.utils.logs import show_events

__all__ = ["Trainer"]

log = logging.getLogger("ktrainer")

_DEFAULT_MAX_EPOCHS = 1000


class Trainer:
    """Runs a `Module`: precision, devices, data, the loop, logging and callbacks.

    All arguments are keyword-only and checked here, before anything is built or written.

    Args:
        max_epochs: Stop after this many epochs. With neither `max_epochs` nor `max_steps`,
            1000 (with a warning at `fit`), as in Lightning.
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
            epoch (float), and at the epoch's end; None: at epoch ends only.
        check_val_every_n_epoch: Validate only in every N-th epoch (at its end and at its
            `val_check_interval` batches); None: not at epoch ends, only every `val_check_interval`
            batches (an int, required) counted over the whole run, across epochs (Lightning's rules).
        log_every_n_steps: Log step metrics every N optimizer steps.
        gradient_clip_val: Clip gradients to this global norm; None: no clipping.
        accumulate_grad_batches: Average the gradients of this many batches per optimizer step.
        steps_per_execution: Batches run inside one compiled call (less Python overhead).
        max_in_flight: The most compiled calls dispatched whose outputs are not read yet: with 2, the
            next call is dispatched before the last one's outputs are read, so the device never waits for
            the host; every step is still accounted, logged and saved exactly, in order. 1: each call is
            read before the next. The loop keeps 1 where a callback's batch hook may read the weights,
            under loss scaling and with manual optimization (see the guide's "max_in_flight").
        seed: Seeds python, numpy, keras and tensorflow (on JAX, only if already imported) at the start
            of `fit`, and the per-epoch shuffle of numpy data; None draws a shuffle seed and seeds nothing.
        fast_dev_run: True (or N) runs 1 (or N) training and validation batches, one epoch,
            without loggers or checkpoints: a quick check that everything runs.
        default_root_dir: Where logs (and checkpoints) go: a local path or any fsspec URL.
        storage_options: fsspec options for `default_root_dir` (credentials, endpoint).
        callbacks: A callback or a list, called in the given order after the built-in ones;
            ModelCheckpoints run last in the hooks where they save, so a checkpoint holds what the
            other callbacks did there.
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
        max_in_flight: int = 2,
        seed: int | None = None,
        fast_dev_run: bool | int = False,
        default_root_dir: str = ".",
        storage_options: dict[str, Any] | None = None,
        callbacks: Callback | Sequence[Callback] | None = None,
        logger: bool | Logger | Sequence[Logger] | None = True,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        preemption_signals: Sequence[str | int] | None = DEFAULT_SIGNALS,
        allow_global_batch_change: bool = False,
    ) -> None:
        show_events()
        self.max_steps = check_int("max_steps", max_steps, minimum=1, allow_none=True)
        self.max_epochs = check_int("max_epochs", max_epochs, minimum=1, allow_none=True)
        self._max_epochs_defaulted = max_epochs is None and max_steps is None and not fast_dev_run
        if max_epochs is None and max_steps is None:
            self.max_epochs = _DEFAULT_MAX_EPOCHS
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
        self.max_in_flight = check_int("max_in_flight", max_in_flight, minimum=1)
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
        check_validation_rhythm(self.val_check_interval, self.check_val_every_n_epoch, self.limit_val_batches)
        self.loggers = resolve_loggers(logger)
        self.callbacks = default_callbacks(callbacks, enable_progress_bar, bool(self.loggers),
                                            self.enable_checkpointing)
        for each in self.loggers:
            each.attach(self.default_root_dir, self.storage_options)
        self.reporter = Reporter(self.loggers, lambda: self.plan.is_chief)
        check_checkpoint_dirs(self.callbacks, self.default_root_dir, self.storage_options)

        self.progress = Progress(shuffle_seed=self.seed if self.seed is not None else draw_seed())
        self.schedule: Schedule | None = None  # when fit validates, logs and stops; made by fit
        self.run = RunIdentity()
        self.clock = RunClock()  # what time-triggered decisions read; each fit starts its own
        self.should_stop = False
        self.stop_reason: str | None = None  # why a callback set should_stop, for the end-of-fit line
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
        self.history = History()
        self.shuffle = True

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
        return trainer_state_dict(self, self._module, self._train_step)

    def _require_built(self, call: str) -> None:
        """Refuse `call` before fit built the model, its optimizer and the training step (a state to save)."""
        module = self._module
        if module is None or module.model is None or self.optimizer is None or self._train_step is None:
            raise RuntimeError(f"{call} needs a built model and optimizer: call it during fit (e.g. from a "
                               "callback) or after fit.")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what `state_dict()` returned (a checkpoint's state): everything, or nothing.

        Every check runs before anything is loaded: the variables must match the model's and
        optimizer's (names and shapes), and the global batch size the saved one (unless
        `allow_global_batch_change`). Callbacks and loggers are matched by key; a key on one side
        only is named in a warning.

        Raises:
            ValueError: When the checkpoint does not fit this model, optimizer or global batch.
        """
        load_trainer_state_dict(self, self._module, self._train_step, state)

    def save_checkpoint(self, filepath: str | os.PathLike | None = None, *,
                        storage_options: dict[str, Any] | None = None) -> list[str]:
        """Save a checkpoint of the full training state now, and wait until it is committed.

        Args:
            filepath: Where (a path or any fsspec URL): one checkpoint there, outside every
                ModelCheckpoint's retention; `fit(module, ckpt_path=filepath)` resumes from it. A
                checkpoint of this run there is replaced; one of another run, a folder of other files
                and a `step-...` name (a ModelCheckpoint's) are refused. Only the chief process
                writes and the others return at once: read it from them once the chief's call
                returned (after fit, say). None: save through every ModelCheckpoint, as its own
                saves (retention applies).
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
        saved = save_checkpoint_at(self, self._module, path, options)
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
        ckpt_path = self._named_checkpoint(check_ckpt_path(ckpt_path))
        if shuffle is not None:
            check_bool("shuffle", shuffle)
        check_validation_split(validation_split, val_data)
        if self._max_epochs_defaulted:  # at fit, as Lightning: a Trainer that only evaluates has no limit to set
            log.warning("Neither max_epochs nor max_steps is set: training stops after max_epochs=%d. Set one of "
                        "them to say when the run ends.", _DEFAULT_MAX_EPOCHS)
        self.run = RunIdentity()
        self.clock = RunClock(shared=self.engine.multi_process)
        self.history = History()
        with self._run("fit", module), SignalWatcher(self.preemption_signals) as signals:
            resumed = find_checkpoint(ckpt_path, self.checkpoint_dir, self.storage_options) if ckpt_path else None
            if ckpt_path and resumed is None:  # a script that always resumes, on its first launch (as in Lightning)
                warnings.warn(f"ckpt_path='last': no checkpoint under {self.checkpoint_dir.url.rstrip('/')} yet; "
                              "starting a new run.", UserWarning, stacklevel=2)
            if resumed is not None and not self.allow_global_batch_change:  # fail before building anything
                check_global_batch(resumed.state["progress"], resumed.state["run"]["global_batch_size"],
                                   self.global_batch_size, allow_change=False)
            self.shuffle = shuffle_setting(shuffle, resumed.state["run"].get("shuffle") if resumed else None)
            if validation_split is not None:
                train_data, val_data = split_training_data(module, train_data, validation_split)
            train = self._source(train_data, module.train_data, "train_data", training=True, required=True)
            self.num_training_batches = batches_per_epoch(train, self.limit_train_batches)
            self.estimated_training_batches = train.estimated_batches
            check_training_steps(self.num_training_batches, train.num_examples, self.batch_size,
                                 self.engine.replicas)
            val = None
            if self.limit_val_batches != 0:
                val = self._source(val_data, module.val_data, "val_data", training=False, required=False)
                if val is not None and not warn_val_data_without_validation_step(module, Module):
                    val = None
                if val is not None:
                    check_validation_stream(val, self.limit_val_batches)
            rhythm = (self.val_check_interval, self.check_val_every_n_epoch) if val is not None else (None, None)
            self.schedule = Schedule(
                self.max_epochs, self.max_steps, self.num_training_batches, self.steps_per_execution,
                self.accumulate_grad_batches, *rhythm, self.log_every_n_steps, whole_groups=self.engine.multi_process)
            self.schedule.check_validation()
            self._build(module, with_optimizer=True)
            train_step = self._train_step = self.engine.train_step(
                module, self.optimizers, self._configured, self.precision, gradient_clip_val=self.gradient_clip_val,
                accumulate_grad_batches=self.accumulate_grad_batches)
            with watch_calls(module.model) as calls:
                keys = self.engine.prepare_train_step(train_step, train)
            warn_if_not_training(calls)
            warn_if_outputs_not_float32(calls, module.model, self.precision)
            if resumed is not None:
                self._resume(resumed)
            train_runner = self.engine.train_runner(train_step, keys)
            val_runner = self.engine.eval_runner(module, val, "validation_step", "val") if val else None
            if self.is_global_zero:
                log.info(fit_summary(self, module, train, val, resumed))
            self.reporter.log_hyperparameters(module.hparams)
            FitLoop(self, module, train, train_step, train_runner, val, val_runner,
                    batches_per_epoch(val, self.limit_val_batches) if val else None, signals).run()
        return self.history

    def _resume(self, resumed: Resumable) -> None:
        """Load a checkpoint into the built run (all or nothing) and note where the run continues from."""
        self.load_state_dict(resumed.state)
        saved_run = resumed.state["run"]
        self.run = self.run.resumed(resumed.canonical_url, resumed.info.committed, saved_run.get("lineage", []))
        log.debug("Resumed from %s at step %d (epoch %d, batch %d).", resumed.info.url, self.global_step,
                  self.current_epoch, self.progress.batch_in_epoch)

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

    def predict(self, module: Module, data: Any = None, ckpt_path: str | os.PathLike | None = None) -> Any:
        """Run `module.predict_step` over the data and concatenate the results.

        Args:
            module: The Module.
            data: Data to predict on; None: `module.predict_data()`. Tuples are taken as
                `(x, ...)` by the default predict_step.
            ckpt_path: Predict with the model weights of a checkpoint ("last", "best", a path or URI);
                None: the module's current weights.

        Returns:
            A numpy array (or a structure of arrays, as predict_step returns), one row per example.
        """
        check_module_hooks(module, Module, ("build",))
        ckpt_path = self._named_checkpoint(check_ckpt_path(ckpt_path))
        with self._run("predict", module):
            source = self._source(data, module.predict_data, "predict_data", training=False, required=True)
            self._build(module, with_optimizer=False)
            if ckpt_path:
                if not module.model.variables:  # a subclassed model gets its variables at its first call
                    self.engine.predict(module, BatchSource(iter([source.first_batch()]), self.global_batch_size))
                load_model_weights(ckpt_path, self.checkpoint_dir, self.storage_options, module.model)
            self._call("on_predict_start", module)
            chunks = self.engine.predict(module, source)
            self._call("on_predict_end", module)
        return keras.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *chunks)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Send metrics to every logger (and to `callback_metrics`), at `step` or the global step."""
        self.reporter.log(metrics, self.global_step if step is None else step, self.current_epoch)

    def _evaluate(self, module: Module, data: Any, hook: str, prefix: str, stage: str,
                  ckpt_path: str | os.PathLike | None) -> dict[str, float]:
        check_module_hooks(module, Module, ("build",))
        ckpt_path = self._named_checkpoint(check_ckpt_path(ckpt_path))
        kind = HOOK_NAMES[prefix]
        with self._run(stage, module):
            source = self._source(data, getattr(module, f"{prefix}_data"), f"{prefix}_data",
                                  training=False, required=True)
            self._build(module, with_optimizer=False)
            limit = self.limit_val_batches if prefix == "val" else None
            runner = self.engine.eval_runner(module, source, hook, prefix)  # a subclassed model is built by now
            if ckpt_path:
                load_model_weights(ckpt_path, self.checkpoint_dir, self.storage_options, module.model)
            self._call(f"on_{kind}_start", module)
            metrics = run_evaluation(self, module, source, runner, batches_per_epoch(source, limit), prefix)
            self.log_metrics(metrics)
            self.eval_results = metrics
            self._call(f"on_{kind}_end", module)
        return metrics

    # ----- set-up and tear-down ---------------------------------------------------------

    def _run(self, stage: str, module: Module) -> contextlib.AbstractContextManager[None]:
        self._module = module
        return call_scope(self, stage, module)

    def _build(self, module: Module, *, with_optimizer: bool) -> None:
        """Set the precision policy, build the model in the engine's scope, and (for fit) its optimizers."""
        build_model(module, self.precision, self.float32_layers, self.engine)
        if with_optimizer:
            built = build_optimizers(module, self.precision, self.engine, self.lr_scaling)
            self._configured, self.optimizers, self.lr_factor = built.configured, built.wrapped, built.lr_factor
            self.optimizer = self.optimizers[0]

    def _source(self, given: Any, hook: Any, what: str, *, training: bool, required: bool) -> BatchSource | None:
        return choose_source(given, hook, what, global_batch_size=self.global_batch_size, training=training,
                             required=required, shuffle=self.shuffle, drop_remainder=self.engine.replicas > 1,
                             limit_batches=self.limit_train_batches)

    def _call(self, hook: str, module: Module, *args: Any) -> None:
        call_hook(self.callbacks, hook, self, module, *args)
