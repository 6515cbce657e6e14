"""The Trainer: its arguments and public face; fit sets a run up and hands it to the `FitLoop` (fit_loop.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import keras

from ktrainer.backends import make_engine
from ktrainer.callbacks import Callback
from ktrainer.checkpoint.lineage import RunIdentity
from ktrainer.checkpoint.resume import check_ckpt_path
from ktrainer.loggers import Logger
from ktrainer.loop.evaluation import evaluate, predict
from ktrainer.loop.fit_loop import FitLoop
from ktrainer.loop.history import History
from ktrainer.loop.preemption import DEFAULT_SIGNALS, SignalWatcher
from ktrainer.loop.reporting import Reporter
from ktrainer.loop.run_clock import RunClock
from ktrainer.loop.run_summary import fit_summary
from ktrainer.loop.trainer_state import TrainerState
from ktrainer.module import Module
from ktrainer.progress import Progress, draw_seed
from ktrainer.schedule import Schedule
from ktrainer.trainer.arguments import DEFAULT_MAX_EPOCHS, check_fit_arguments, check_trainer_arguments
from ktrainer.trainer.call_scope import call_scope
from ktrainer.trainer.module_checks import check_module_hooks
from ktrainer.trainer.resume_checks import check_checkpoint_dirs
from ktrainer.trainer.setup import prepare_evaluation, prepare_fit, prepare_prediction
from ktrainer.trainer.state_methods import StateMethods
from ktrainer.utils.logs import show_events

__all__ = ["Trainer"]

log = logging.getLogger("ktrainer")


class Trainer(StateMethods):
    """Runs a `Module`: precision, devices, data, the loop, logging and callbacks.

    All arguments are keyword-only and checked here, before anything is built or written.

    Args:
        max_epochs: Stop after this many epochs. With neither `max_epochs` nor `max_steps`, 1000 (with a warning at
            `fit`), as in Lightning.
        max_steps: Stop after this many optimizer steps.
        batch_size: Examples per device per step; the global batch is this times the replicas.
        precision: "32-true" (alias "32"), "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true" (alias "64"), or
            a `Precision` plugin such as `MixedPrecision("16-mixed", initial_scale=...)`.
        float32_layers: Layer classes or names that compute in float32 whatever the precision (e.g.
            `[keras.layers.BatchNormalization]`), when accuracy suffers without NaN.
        accelerator: "auto" (TPU if present, else GPU, else CPU), "cpu", "gpu" or "tpu".
        devices: "auto" (every GPU, else one CPU), a count, or a list of device indices. On a machine without GPUs,
            `devices=N` splits the CPU into N logical devices.
        strategy: "auto", "one_device", "mirrored", "multi_worker", "tpu", or a tf.distribute.Strategy; on JAX
            also "data_parallel", "fsdp" (each large variable sharded over the devices), "model_parallel" (the
            layouts of `Module.configure_layout`), or a keras.distribution.ModelParallel / DataParallel.
        mesh: The device mesh of "fsdp"/"model_parallel" (JAX): axis name -> size, e.g. `{"batch": 2, "model": 4}`,
            or a keras.distribution.DeviceMesh; None: "fsdp" puts every device on one "batch" axis. The global batch
            is `batch_size` x the "batch" axis's size.
        fsdp_min_bytes: Under "fsdp", variables of at least this many bytes (default 1 MiB) are sharded, smaller ones
            replicated.
        num_nodes: Worker processes; more than 1 (or a TF_CONFIG cluster) uses MultiWorkerMirroredStrategy.
        lr_scaling: None (never change the learning rate), "sqrt" or "linear": scale the rate written for one replica by
            the square root of, or by, the number of replicas.
        limit_train_batches: Batches per training epoch: an int, or a float fraction of the epoch.
        limit_val_batches: Batches per validation: an int (0 turns validation off) or a fraction.
        val_check_interval: Validate every N training batches (int) or every fraction of an epoch (float), and at the
            epoch's end; None: at epoch ends only.
        check_val_every_n_epoch: Validate only in every N-th epoch (at its end and at its `val_check_interval` batches);
            None: not at epoch ends, only every `val_check_interval` batches (an int, required) counted over the whole
            run, across epochs (Lightning's rules).
        log_every_n_steps: Log step metrics every N optimizer steps.
        gradient_clip_val: Clip gradients to this global norm; None: no clipping.
        accumulate_grad_batches: Average the gradients of this many batches per optimizer step.
        steps_per_execution: Batches run inside one compiled call (less Python overhead).
        max_in_flight: The most compiled calls dispatched whose outputs are not read yet: with 2 the device never waits
            for the host, and every step is still accounted, logged and saved exactly, in order; 1: each call is read
            before the next (the guide's "max_in_flight" says where the loop keeps 1).
        seed: Seeds python, numpy, keras and tensorflow (on JAX, only if already imported) at the start of `fit`, and
            the per-epoch shuffle of numpy data; None draws a shuffle seed and seeds nothing.
        fast_dev_run: True (or N) runs 1 (or N) training and validation batches, one epoch, without loggers or
            checkpoints: a quick check that everything runs.
        default_root_dir: Where logs (and checkpoints) go: a local path or any fsspec URL.
        storage_options: fsspec options for `default_root_dir` (credentials, endpoint).
        callbacks: A callback or a list, called in the given order after the built-in ones; ModelCheckpoints run last in
            the hooks where they save, so a checkpoint holds what the other callbacks did there.
        logger: True (a TensorBoardLogger), False/None, a Logger, or a list of Loggers.
        enable_progress_bar: Show the progress bar.
        enable_checkpointing: Add a default ModelCheckpoint (unless one is among the callbacks).
        preemption_signals: Signals that stop fit cleanly: finish the step, save a checkpoint, run the hooks, close the
            loggers, raise `Preempted` (exit status 128 + signal). Default SIGTERM (spot VMs, Kubernetes) and SIGUSR1
            (SLURM's --signal); None: not watched.
        allow_global_batch_change: Let a run resume a checkpoint saved with another global batch size (other devices or
            batch_size); the data position is carried over in examples.

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
        mesh: Any = None,
        fsdp_min_bytes: int = 1_048_576,
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
        self.settings = check_trainer_arguments(**{name: value for name, value in locals().items() if name != "self"})
        for field in fields(self.settings):  # each setting is also the Trainer's attribute of that name
            setattr(self, field.name, getattr(self.settings, field.name))
        self.engine = make_engine(self.plan)
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
        self.num_training_batches: int | None = None  # estimated_: for display, also for data of unknown length
        self.estimated_training_batches: int | None = None
        self.eval_results: dict[str, float] = {}  # what the last validate()/test() returned
        self.optimizer: keras.optimizers.Optimizer | None = None
        self.optimizers: list[keras.optimizers.Optimizer] = []
        self.configured_optimizers: list[keras.optimizers.Optimizer] = []
        self.lr_factor = 1.0
        self.module: Module | None = None  # the Module of the last fit/validate/test/predict
        self.state = TrainerState()
        self.train_step: Any = None
        self.history = History()
        self.shuffle = True

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

    def fit(self, module: Module, train_data: Any = None, val_data: Any = None,
            ckpt_path: str | os.PathLike | None = None, shuffle: bool | None = None,
            validation_split: float | None = None) -> History:
        """Train `module`: build it, then run epochs of training (and validation) until a limit.

        Args:
            module: The Module to train.
            train_data: Training data; None: `module.train_data()`.
            val_data: Validation data; None: `module.val_data()` (None there: no validation).
            ckpt_path: Resume from "last" (the most recently committed checkpoint under the run's checkpoint directory),
                "best" (by the monitor its manifests record), or a checkpoint's path or URI: the run continues as if it
                had never stopped.
            shuffle: Shuffle numpy training data each epoch (Keras's name). None: True, or what the checkpoint resumed
                from was trained with (a checkpoint keeps it).
            validation_split: A fraction between 0 and 1: the last part of numpy training data, taken before shuffling,
                validates instead of training (Keras's name and meaning).

        Returns:
            A `History` of this call's epochs (`history.history["val/loss"]`, ...).

        Raises:
            TypeError: If the module lacks a required hook.
            ValueError: If an argument is wrong, there is no training data, or the checkpoint does
                not fit (nothing is loaded).
            CheckpointError: If `ckpt_path` names no valid checkpoint.
            Preempted: After a preemption signal, once a checkpoint is saved (a SystemExit).
        """
        check_module_hooks(module, ("build", "configure_optimizers", "training_step"))
        ckpt_path = self._named_checkpoint(check_ckpt_path(ckpt_path))
        check_fit_arguments(shuffle, validation_split, val_data)
        if self.settings.max_epochs_defaulted:  # at fit, as Lightning: a Trainer that only evaluates sets no limit
            log.warning("Neither max_epochs nor max_steps is set: training stops after max_epochs=%d. Set one of "
                        "them to say when the run ends.", DEFAULT_MAX_EPOCHS)
        self.run, self.clock, self.history = RunIdentity(), RunClock(shared=self.engine.multi_process), History()
        with call_scope(self, "fit", module), SignalWatcher(self.preemption_signals) as signals:
            run = prepare_fit(self, module, train_data, val_data, ckpt_path, shuffle, validation_split)
            if self.is_global_zero:
                log.info(fit_summary(self, module, run.train, run.val, run.resumed))
            self.reporter.log_hyperparameters(module.hparams)
            FitLoop(self, module, run.train, run.train_step, run.train_runner, run.val, run.val_runner,
                    run.val_batches, signals).run()
        return self.history

    def validate(self, module: Module, data: Any = None, ckpt_path: str | os.PathLike | None = None,
                 ) -> dict[str, float]:
        """Run `module.validation_step` over the validation data.

        Args:
            module: The Module (built here if it was not trained in this process).
            data: Validation data; None: `module.val_data()`.
            ckpt_path: Validate the model weights of a checkpoint: "last", "best" or a checkpoint's path or URI (as in
                `fit`); None: the module's current weights.

        Returns:
            The epoch metrics, e.g. {"val/loss": 0.31, "val/acc": 0.92}.
        """
        return self._evaluate(module, data, "validation_step", "val", "validate", ckpt_path)

    def test(self, module: Module, data: Any = None, ckpt_path: str | os.PathLike | None = None) -> dict[str, float]:
        """Run `module.test_step` over the test data.

        Args:
            module: The Module.
            data: Test data; None: `module.test_data()`.
            ckpt_path: Test the model weights of a checkpoint ("last", "best", a path or URI); None: the module's
                current weights.

        Returns:
            The epoch metrics, e.g. {"test/loss": 0.33}.
        """
        return self._evaluate(module, data, "test_step", "test", "test", ckpt_path)

    def predict(self, module: Module, data: Any = None, ckpt_path: str | os.PathLike | None = None) -> Any:
        """Run `module.predict_step` over the data and concatenate the results.

        Args:
            module: The Module.
            data: Data to predict on; None: `module.predict_data()`. Tuples are taken as `(x, ...)` by the default
                predict_step.
            ckpt_path: Predict with the model weights of a checkpoint ("last", "best", a path or URI); None: the
                module's current weights.

        Returns:
            A numpy array (or a structure of arrays, as predict_step returns), one row per example.
        """
        check_module_hooks(module, ("build",))
        ckpt_path = self._named_checkpoint(check_ckpt_path(ckpt_path))
        with call_scope(self, "predict", module):
            return predict(self, module, prepare_prediction(self, module, data, ckpt_path))

    def _evaluate(self, module: Module, data: Any, hook: str, prefix: str, stage: str,
                  ckpt_path: str | os.PathLike | None) -> dict[str, float]:
        check_module_hooks(module, ("build",))
        ckpt_path = self._named_checkpoint(check_ckpt_path(ckpt_path))
        with call_scope(self, stage, module):
            source, runner = prepare_evaluation(self, module, data, hook, prefix, ckpt_path)
            return evaluate(self, module, source, runner, prefix)
