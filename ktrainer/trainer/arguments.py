"""The Trainer's 30 keyword arguments, each checked before anything is built or written.

`check_trainer_arguments` turns what the user passed into `TrainerSettings`: every value checked (each error
says what was wrong, what is expected and how to fix it), the defaults applied (`max_epochs=1000` when no
limit is set, what `fast_dev_run` overrides), the device plan made, the callbacks and loggers resolved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ktrainer.backends import plan_devices
from ktrainer.checks import (
    check_bool,
    check_choice,
    check_count_or_fraction,
    check_fast_dev_run,
    check_int,
    check_path,
    check_storage_options,
    optional,
)
from ktrainer.data.sources import check_validation_split
from ktrainer.loop.preemption import check_signals
from ktrainer.precision import Precision, resolve_precision
from ktrainer.schedule import check_validation_rhythm
from ktrainer.trainer.defaults import default_callbacks, resolve_loggers
from ktrainer.trainer.lr_scaling import LR_SCALINGS

__all__ = ["TrainerSettings", "check_trainer_arguments", "check_fit_arguments", "DEFAULT_MAX_EPOCHS"]

DEFAULT_MAX_EPOCHS = 1000  # with neither max_epochs nor max_steps, as in Lightning


@dataclass(frozen=True)
class TrainerSettings:
    """What a Trainer was asked to do, checked: the Trainer's arguments of the same names (see `Trainer`).

    Beside them: `max_epochs_defaulted` (no limit was given: fit warns), `plan` (the device plan made from
    accelerator/devices/strategy/num_nodes), and the resolved `callbacks` and `loggers`.
    """

    max_epochs: int | None
    max_steps: int | None
    max_epochs_defaulted: bool
    batch_size: int
    precision: Precision
    float32_layers: list
    lr_scaling: str | None
    plan: Any
    limit_train_batches: int | float | None
    limit_val_batches: int | float | None
    val_check_interval: int | float | None
    check_val_every_n_epoch: int | None
    log_every_n_steps: int
    gradient_clip_val: float | None
    accumulate_grad_batches: int
    steps_per_execution: int
    max_in_flight: int
    seed: int | None
    fast_dev_run: int
    default_root_dir: str
    storage_options: dict[str, Any]
    enable_checkpointing: bool
    preemption_signals: tuple
    allow_global_batch_change: bool
    callbacks: list
    loggers: list


def check_trainer_arguments(*, max_epochs: int | None, max_steps: int | None, batch_size: int, precision: Any,
                            float32_layers: Sequence[type | str] | None, accelerator: str, devices: Any,
                            strategy: Any, mesh: Any, fsdp_min_bytes: int, num_nodes: int, lr_scaling: str | None,
                            limit_train_batches: int | float | None, limit_val_batches: int | float | None,
                            val_check_interval: int | float | None, check_val_every_n_epoch: int | None,
                            log_every_n_steps: int, gradient_clip_val: float | None, accumulate_grad_batches: int,
                            steps_per_execution: int, max_in_flight: int, seed: int | None,
                            fast_dev_run: bool | int, default_root_dir: str, storage_options: dict[str, Any] | None,
                            callbacks: Any, logger: Any, enable_progress_bar: bool, enable_checkpointing: bool,
                            preemption_signals: Sequence[str | int] | None,
                            allow_global_batch_change: bool) -> TrainerSettings:
    """Check every Trainer argument, in the order the user wrote them, and apply the defaults they imply.

    Raises:
        ValueError: For any argument value that is not supported, naming the allowed ones.
    """
    settings = TrainerSettings(
        max_steps=check_int("max_steps", max_steps, minimum=1, allow_none=True),
        max_epochs=check_int("max_epochs", max_epochs, minimum=1, allow_none=True),
        max_epochs_defaulted=max_epochs is None and max_steps is None and not fast_dev_run,
        batch_size=check_int("batch_size", batch_size, minimum=1),
        precision=resolve_precision(precision),
        float32_layers=_float32_layers(float32_layers),
        lr_scaling=check_choice("lr_scaling", lr_scaling, LR_SCALINGS),
        plan=plan_devices(accelerator, devices, strategy, num_nodes, mesh,
                          check_int("fsdp_min_bytes", fsdp_min_bytes, minimum=0)),
        limit_train_batches=optional(check_count_or_fraction, "limit_train_batches", limit_train_batches),
        limit_val_batches=optional(check_count_or_fraction, "limit_val_batches", limit_val_batches,
                                   allow_zero=True),
        val_check_interval=optional(check_count_or_fraction, "val_check_interval", val_check_interval),
        check_val_every_n_epoch=check_int("check_val_every_n_epoch", check_val_every_n_epoch, minimum=1,
                                          allow_none=True),
        log_every_n_steps=check_int("log_every_n_steps", log_every_n_steps, minimum=1),
        gradient_clip_val=_gradient_clip_val(gradient_clip_val),
        accumulate_grad_batches=check_int("accumulate_grad_batches", accumulate_grad_batches, minimum=1),
        steps_per_execution=check_int("steps_per_execution", steps_per_execution, minimum=1),
        max_in_flight=check_int("max_in_flight", max_in_flight, minimum=1),
        seed=check_int("seed", seed, minimum=0, allow_none=True),
        fast_dev_run=check_fast_dev_run(fast_dev_run),
        default_root_dir=check_path("default_root_dir", default_root_dir),
        storage_options=check_storage_options("storage_options", storage_options),
        enable_checkpointing=check_bool("enable_checkpointing", enable_checkpointing),
        preemption_signals=check_signals(preemption_signals),
        allow_global_batch_change=check_bool("allow_global_batch_change", allow_global_batch_change),
        callbacks=[], loggers=[],
    )
    if settings.max_epochs is None and settings.max_steps is None:
        settings = replace(settings, max_epochs=DEFAULT_MAX_EPOCHS)
    if settings.fast_dev_run:
        n = settings.fast_dev_run
        settings = replace(settings, max_epochs=1, max_steps=None, limit_train_batches=n, limit_val_batches=n,
                           val_check_interval=None, check_val_every_n_epoch=1, enable_checkpointing=False)
        logger = False
    check_validation_rhythm(settings.val_check_interval, settings.check_val_every_n_epoch,
                            settings.limit_val_batches)
    loggers = resolve_loggers(logger)
    return replace(settings, loggers=loggers, callbacks=default_callbacks(
        callbacks, enable_progress_bar, bool(loggers), settings.enable_checkpointing))


def check_fit_arguments(shuffle: bool | None, validation_split: float | None, val_data: Any) -> None:
    """Check `fit`'s `shuffle` and `validation_split` (the latter only without `val_data`).

    Raises:
        ValueError: For a `shuffle` that is not a bool or None, or a split that is not a fraction in (0, 1).
    """
    if shuffle is not None:
        check_bool("shuffle", shuffle)
    check_validation_split(validation_split, val_data)


def _float32_layers(selectors: Sequence[type | str] | None) -> list:
    """`float32_layers` as a list of layer classes and names."""
    selectors = list(selectors or [])
    for selector in selectors:
        if not isinstance(selector, str | type):
            raise ValueError(f"float32_layers takes layer classes or layer names, got {selector!r}.")
    return selectors


def _gradient_clip_val(value: float | None) -> float | None:
    """`gradient_clip_val`: a number > 0, or None."""
    if value is not None and not (isinstance(value, int | float) and value > 0):
        raise ValueError(f"gradient_clip_val must be a number > 0 or None, got {value!r}.")
    return value
