"""Everything `Trainer.fit` does before its first step, in the order it happens: `prepare_fit` -> `FitRun`.

1. the checkpoint to resume from, found and checked against this run (global batch, shuffle) before
   anything is built: `find_resumable`;
2. the training and validation data, and the `Schedule` of when the loop validates, logs and stops;
3. the model and its optimizers built under the precision and the engine's scope;
4. the compiled step, traced once on the first batch (what the module logs; the checks of what the
   trace showed: training mode, float16 outputs);
5. the checkpoint loaded, all or nothing (its variables and keys checked first): `resume_into`;
6. the runners the loop calls.

Validate, test and predict set up with `prepare_evaluation` / `prepare_prediction`: data, model, weights.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ktrainer.checkpoint.resume import Resumable, find_checkpoint, load_model_weights
from ktrainer.data.checks import check_training_steps, check_validation_stream
from ktrainer.data.sources import BatchSource, batches_per_epoch
from ktrainer.data.stage_data import choose_source, shuffle_setting, split_training_data
from ktrainer.module import Module
from ktrainer.schedule import Schedule
from ktrainer.trainer.building import build_model, build_optimizers
from ktrainer.trainer.module_checks import warn_val_data_without_validation_step
from ktrainer.trainer.resume_checks import check_global_batch
from ktrainer.trainer.tracing import warn_if_not_training, warn_if_outputs_not_float32, watch_calls
from ktrainer.utils.logs import warn_user

if TYPE_CHECKING:
    from ktrainer.trainer.trainer import Trainer

__all__ = ["FitRun", "prepare_fit", "find_resumable", "resume_into", "build", "data_source",
           "prepare_evaluation", "prepare_prediction"]

log = logging.getLogger("ktrainer")


@dataclass(frozen=True)
class FitRun:
    """What `prepare_fit` made for the loop.

    Attributes:
        train: The training data.
        val: The validation data; None: no validation.
        val_batches: Batches per validation (None: until the data ends, or no validation).
        train_step: The engine's training step, traced and built.
        train_runner: Runs it N batches per call.
        val_runner: Runs `validation_step`; None without validation.
        schedule: When the loop validates, logs and stops.
        resumed: The checkpoint the run continues from; None for a new run.
    """

    train: BatchSource
    val: BatchSource | None
    val_batches: int | None
    train_step: Any
    train_runner: Any
    val_runner: Any
    schedule: Schedule
    resumed: Resumable | None


def prepare_fit(trainer: Trainer, module: Module, train_data: Any, val_data: Any, ckpt_path: str | None,
                shuffle: bool | None, validation_split: float | None) -> FitRun:
    """Set a fit up on `trainer` (its schedule, optimizers, step, loaded state) and return what the loop runs.

    Raises:
        ValueError: No training data, a schedule that cannot run, or a checkpoint that does not fit.
        CheckpointError: If `ckpt_path` names no valid checkpoint.
    """
    resumed = find_resumable(trainer, ckpt_path)
    trainer.shuffle = shuffle_setting(shuffle, resumed.state["run"].get("shuffle") if resumed else None)
    if validation_split is not None:
        train_data, val_data = split_training_data(module, train_data, validation_split)
    train = data_source(trainer, train_data, module.train_data, "train_data", training=True, required=True)
    trainer.num_training_batches = batches_per_epoch(train, trainer.limit_train_batches)
    trainer.estimated_training_batches = train.estimated_batches
    check_training_steps(trainer.num_training_batches, train.num_examples, trainer.batch_size,
                         trainer.engine.replicas)
    val = _validation_source(trainer, module, val_data)
    schedule = trainer.schedule = _schedule(trainer, validates=val is not None)
    build(trainer, module, with_optimizer=True)
    train_step = trainer.train_step = trainer.engine.train_step(
        module, trainer.optimizers, trainer.configured_optimizers, trainer.precision,
        gradient_clip_val=trainer.gradient_clip_val, accumulate_grad_batches=trainer.accumulate_grad_batches)
    with watch_calls(module.model) as calls:
        keys = trainer.engine.prepare_train_step(train_step, train)
    warn_if_not_training(calls)
    warn_if_outputs_not_float32(calls, module.model, trainer.precision)
    if resumed is not None:
        resume_into(trainer, resumed)
    return FitRun(train, val, batches_per_epoch(val, trainer.limit_val_batches) if val else None, train_step,
                  trainer.engine.train_runner(train_step, keys),
                  trainer.engine.eval_runner(module, val, "validation_step", "val") if val else None,
                  schedule, resumed)


def find_resumable(trainer: Trainer, ckpt_path: str | None) -> Resumable | None:
    """The checkpoint `ckpt_path` names (None for a new run), its global batch checked before anything is built.

    A `ckpt_path="last"` that finds nothing starts a new run with a warning (a script that always resumes, on its
    first launch, as in Lightning).

    Raises:
        ValueError: When its global batch differs and `allow_global_batch_change` is False.
        CheckpointError: If `ckpt_path` names no valid checkpoint.
    """
    if not ckpt_path:
        return None
    resumed = find_checkpoint(ckpt_path, trainer.checkpoint_dir, trainer.storage_options)
    if resumed is None:
        warn_user(f"ckpt_path='last': no checkpoint under {trainer.checkpoint_dir.url.rstrip('/')} yet; "
                  "starting a new run.")
    elif not trainer.allow_global_batch_change:
        check_global_batch(resumed.state["progress"], resumed.state["run"]["global_batch_size"],
                           trainer.global_batch_size, allow_change=False)
    return resumed


def resume_into(trainer: Trainer, resumed: Resumable) -> None:
    """Load a checkpoint into the built run (all or nothing: `Trainer.load_state_dict` checks its variables,
    keys and global batch first) and note where the run continues from."""
    trainer.load_state_dict(resumed.state, copy=False)  # nothing reads the checkpoint's arrays again
    saved_run = resumed.state["run"]
    trainer.run = trainer.run.resumed(resumed.canonical_url, resumed.info.committed, saved_run.get("lineage", []))
    log.debug("Resumed from %s at step %d (epoch %d, batch %d).", resumed.info.url, trainer.global_step,
              trainer.current_epoch, trainer.progress.batch_in_epoch)


def _validation_source(trainer: Trainer, module: Module, val_data: Any) -> BatchSource | None:
    """The validation data of a fit, checked; None when validation is off or there is none to run."""
    if trainer.limit_val_batches == 0:
        return None
    val = data_source(trainer, val_data, module.val_data, "val_data", training=False, required=False)
    if val is None or not warn_val_data_without_validation_step(module, Module):
        return None
    check_validation_stream(val, trainer.limit_val_batches)
    return val


def _schedule(trainer: Trainer, *, validates: bool) -> Schedule:
    """The fit's Schedule, checked (a validation rhythm only when there is validation)."""
    rhythm = (trainer.val_check_interval, trainer.check_val_every_n_epoch) if validates else (None, None)
    schedule = Schedule(trainer.max_epochs, trainer.max_steps, trainer.num_training_batches,
                        trainer.steps_per_execution, trainer.accumulate_grad_batches, *rhythm,
                        trainer.log_every_n_steps, whole_groups=trainer.engine.multi_process)
    schedule.check_validation()
    return schedule


def build(trainer: Trainer, module: Module, *, with_optimizer: bool) -> None:
    """Set the precision policy, build the model in the engine's scope, and (for fit) its optimizers."""
    build_model(module, trainer.precision, trainer.float32_layers, trainer.engine)
    if with_optimizer:
        built = build_optimizers(module, trainer.precision, trainer.engine, trainer.lr_scaling)
        trainer.configured_optimizers, trainer.optimizers = built.configured, built.wrapped
        trainer.lr_factor, trainer.optimizer = built.lr_factor, built.wrapped[0]


def data_source(trainer: Trainer, given: Any, hook: Any, what: str, *, training: bool,
                required: bool) -> BatchSource | None:
    """The data one call runs on: `given`, else what the module's `hook` returns (see `choose_source`)."""
    return choose_source(given, hook, what, global_batch_size=trainer.global_batch_size, training=training,
                         required=required, shuffle=trainer.shuffle, drop_remainder=trainer.engine.replicas > 1,
                         limit_batches=trainer.limit_train_batches)


def prepare_evaluation(trainer: Trainer, module: Module, data: Any, hook: str, prefix: str,
                       ckpt_path: str | os.PathLike | None) -> tuple[BatchSource, Any]:
    """The data and the compiled `hook` ("validation_step"/"test_step") of a validate/test call, with the
    weights of `ckpt_path` loaded when given."""
    source = data_source(trainer, data, getattr(module, f"{prefix}_data"), f"{prefix}_data", training=False,
                         required=True)
    build(trainer, module, with_optimizer=False)
    runner = trainer.engine.eval_runner(module, source, hook, prefix)  # a subclassed model is built by now
    if ckpt_path:
        load_model_weights(ckpt_path, trainer.checkpoint_dir, trainer.storage_options, module.model)
    return source, runner


def prepare_prediction(trainer: Trainer, module: Module, data: Any, ckpt_path: str | os.PathLike | None,
                       ) -> BatchSource:
    """The data of a predict call, the model built and the weights of `ckpt_path` loaded when given."""
    source = data_source(trainer, data, module.predict_data, "predict_data", training=False, required=True)
    build(trainer, module, with_optimizer=False)
    if ckpt_path:
        if not module.model.variables:  # a subclassed model gets its variables at its first call
            trainer.engine.predict(module, BatchSource(iter([source.first_batch()]), trainer.global_batch_size))
        load_model_weights(ckpt_path, trainer.checkpoint_dir, trainer.storage_options, module.model)
    return source
