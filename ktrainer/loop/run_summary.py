"""What a user must see of a fit without asking: one block at the start, one line at the end.

The block says what will run (model size, precision and policy, devices and strategy, the
per-device and global batch, the learning-rate scaling applied, the data, where the run resumes,
where logs and checkpoints go, when it stops); the line says why it stopped, after how many steps
and how long, and the best metric and checkpoint. Both are INFO lines of the "ktrainer" logger,
shown by default (see `ktrainer.utils.logs`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ktrainer.precision.report import precision_report, summarize

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["fit_summary", "stop_reason", "stop_line"]


def _count(variables: list) -> int:
    return int(sum(np.prod(v.shape) for v in variables))


def _batch_line(trainer: Trainer, train: Any) -> str:
    replicas = trainer.num_replicas
    each = "per device" if trainer.engine.device_count == replicas else "per replica"
    line = f"{trainer.batch_size} {each} x {replicas} replica{'s' if replicas != 1 else ''} = " \
           f"{trainer.global_batch_size} global"
    if trainer.accumulate_grad_batches > 1:
        line += f", x {trainer.accumulate_grad_batches} accumulated per optimizer step"
    if train.drop_remainder:
        line += " (the last incomplete batch of an epoch is dropped)"
    return line


def _rate_line(trainer: Trainer) -> str:
    replicas = trainer.num_replicas
    if trainer.lr_factor != 1.0:
        return f"lr_scaling={trainer.lr_scaling!r}: learning rate x {trainer.lr_factor:.4g} for {replicas} replicas"
    if replicas > 1 and trainer.lr_scaling is None:
        return (f"unchanged for a {replicas}x larger global batch (Trainer(lr_scaling='sqrt' or 'linear') scales "
                "it)")
    return "as configured"


def _data_line(train: Any, val: Any, batches: int | None) -> str:
    examples = train.num_examples
    line = f"{examples} training examples" if examples is not None else "training data of unknown length"
    line += f", {batches} batches per epoch" if batches is not None else ""
    if val is not None:
        line += f"; validation: {val.num_examples} examples" if val.num_examples is not None else "; validation"
    return line


def _stops_at(trainer: Trainer) -> str:
    limits = [f"max_steps={trainer.max_steps}"] if trainer.max_steps is not None else []
    if trainer.max_epochs is not None:
        limits.append(f"max_epochs={trainer.max_epochs}")
    return " or ".join(limits)


def _size(count: int) -> str:
    """Bytes in the unit that reads best: "812 B", "49.4 KiB", "1.25 GiB"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.{1 if unit == 'KiB' else 2}f} {unit}"
    return f"{count} B"


def _sharding_rows(trainer: Trainer, module: Module) -> list[tuple[str, str]]:
    """A sharded run's table: the weights and optimizer state one device holds, against every device holding all."""
    held = trainer.engine.state_bytes(module, trainer.optimizers or [])
    if held is None:
        return []
    device, replicated = (sum(pair[i] for pair in held.values()) for i in (0, 1))
    share = f"{device / replicated:.0%}" if replicated else "-"

    def line(index: int, total: int) -> str:
        return ", ".join(f"{name} {_size(pair[index])}" for name, pair in held.items()) + \
            f", total {_size(total)}"

    return [("per device", line(0, device) + f" ({share} of replicated)"), ("replicated", line(1, replicated))]


def fit_summary(trainer: Trainer, module: Module, train: Any, val: Any, resumed: Any) -> str:
    """The block logged at the start of fit (after building and resuming, before the first step)."""
    model = module.model
    total, trainable = _count(model.weights), _count(model.trainable_weights)
    precision = trainer.precision
    rows = [
        ("model", f"{type(module).__name__}: {model.name}, {total:,} parameters ({trainable:,} trainable)"),
        ("precision", summarize(precision_report(model), precision.name, precision.policy)
         + (", dynamic loss scaling" if precision.loss_scaling else "")),
        ("devices", f"{trainer.engine.device_count} x {trainer.plan.accelerator}, strategy "
                    f"{trainer.engine.strategy_name()}"
                    + (f", {trainer.plan.num_nodes} nodes" if trainer.plan.num_nodes > 1 else "")),
        *_sharding_rows(trainer, module),
        ("batch", _batch_line(trainer, train)),
        ("learning rate", _rate_line(trainer)),
        ("data", _data_line(train, val, trainer.num_training_batches)),
        ("run", f"resumed from {resumed.info.url} at step {trainer.global_step} (epoch {trainer.current_epoch}, "
                f"batch {trainer.progress.batch_in_epoch})" if resumed is not None
         else f"new run {trainer.run.run_id}"),
        ("stops at", _stops_at(trainer)),
    ]
    writers = trainer.reporter.writing_loggers
    if writers:
        rows.append(("logs", ", ".join(str(each.log_dir) for each in writers)))
    if trainer.checkpoint_callback is not None:
        rows.append(("checkpoints", trainer.checkpoint_callback.resolve_location(
            trainer.default_root_dir, trainer.storage_options).url))
    width = max(len(name) for name, _ in rows)
    return "\n".join(["Fit:"] + [f"  {name:<{width}}  {value}" for name, value in rows])


def stop_reason(trainer: Trainer) -> str:
    """Why the loop ended: a callback's reason, or the limit reached."""
    if trainer.should_stop:
        return trainer.stop_reason or "a callback set trainer.should_stop"
    if trainer.max_steps is not None and trainer.global_step >= trainer.max_steps:
        return f"max_steps={trainer.max_steps} reached"
    return f"max_epochs={trainer.max_epochs} reached"


def stop_line(trainer: Trainer, seconds: float) -> str:
    """The line logged at the end of fit: why, how far, how long, the best metric and checkpoint."""
    skipped = f", {trainer.skipped_steps} skipped" if trainer.skipped_steps else ""
    line = (f"Stopped: {stop_reason(trainer)}, at step {trainer.global_step}{skipped} (epoch "
            f"{trainer.current_epoch}) after {seconds:.1f} s")
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.monitor and checkpoint.best_value is not None \
            and math.isfinite(checkpoint.best_value):
        line += f"; best {checkpoint.monitor}={checkpoint.best_value:.6g}"
    if checkpoint is not None and checkpoint.last_saved:
        line += f"; last checkpoint {checkpoint.last_saved}"
    return line + "."
