"""Trainer arguments as command-line flags, shared by `ktrainer fit` and `ktrainer demo`."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_trainer_flags", "trainer_kwargs"]


def count_or_fraction(text: str) -> int | float:
    """Parse "10" as 10 (batches) and "0.25" as 0.25 (a fraction of the epoch)."""
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def int_or_auto(text: str) -> int | str:
    """Parse an int, or the string "auto"."""
    return text if text == "auto" else int(text)


# flag -> (Trainer argument, argparse options)
_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--max-epochs": ("max_epochs", {"type": int}),
    "--max-steps": ("max_steps", {"type": int}),
    "--batch-size": ("batch_size", {"type": int, "help": "examples per device per step"}),
    "--precision": ("precision", {}),
    "--accelerator": ("accelerator", {}),
    "--devices": ("devices", {"type": int_or_auto}),
    "--strategy": ("strategy", {}),
    "--num-nodes": ("num_nodes", {"type": int}),
    "--lr-scaling": ("lr_scaling", {}),
    "--limit-train-batches": ("limit_train_batches", {"type": count_or_fraction}),
    "--limit-val-batches": ("limit_val_batches", {"type": count_or_fraction}),
    "--val-check-interval": ("val_check_interval", {"type": count_or_fraction}),
    "--check-val-every-n-epoch": ("check_val_every_n_epoch", {"type": int}),
    "--log-every-n-steps": ("log_every_n_steps", {"type": int}),
    "--gradient-clip-val": ("gradient_clip_val", {"type": float}),
    "--accumulate-grad-batches": ("accumulate_grad_batches", {"type": int}),
    "--steps-per-execution": ("steps_per_execution", {"type": int}),
    "--seed": ("seed", {"type": int}),
    "--fast-dev-run": ("fast_dev_run", {"type": int, "nargs": "?", "const": 1}),
    "--root": ("default_root_dir", {"help": "default_root_dir: a local path or any fsspec URL"}),
}


def add_trainer_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for each Trainer argument; unset flags keep the Trainer's defaults."""
    group = parser.add_argument_group("Trainer arguments")
    for flag, (dest, options) in _FLAGS.items():
        group.add_argument(flag, dest=dest, default=None, **options)
    group.add_argument("--no-progress-bar", dest="enable_progress_bar", action="store_false", default=None)
    group.add_argument("--no-logger", dest="logger", action="store_false", default=None)
    group.add_argument("--no-checkpointing", dest="enable_checkpointing", action="store_false", default=None)


def trainer_kwargs(args: argparse.Namespace, **defaults: Any) -> dict[str, Any]:
    """The Trainer keyword arguments given on the command line, over `defaults`."""
    names = [dest for dest, _ in _FLAGS.values()] + ["enable_progress_bar", "logger", "enable_checkpointing"]
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return {**defaults, **given}
