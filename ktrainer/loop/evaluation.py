"""One evaluation run (validation inside fit, `validate`, `test`): its hooks around the batches, exact results;
and the body of `Trainer.validate`/`test`/`predict` once their data and model are set up."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from ktrainer.callbacks.callback_list import call_hook
from ktrainer.data.checks import check_training_steps
from ktrainer.data.sources import BatchSource, batches_per_epoch
from ktrainer.module import module_runtime
from ktrainer.step.metrics import EpochMetrics, hook_values, metric_object_values, reset_metric_objects

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["run_evaluation", "evaluate", "predict", "HOOK_NAMES"]

HOOK_NAMES = {"val": "validation", "test": "test"}  # the prefix of the logged names -> the hooks' word


def run_evaluation(trainer: Trainer, module: Module, source: BatchSource, runner: Any, num_batches: int | None,
                   stage: str, before_execution: Callable[[], None] | None = None) -> dict[str, float]:
    """Run `runner` over `source` (at most `num_batches`), between the epoch hooks of `stage` ("val" or "test").

    The module's metric objects of the stage are reset first; the results are the means over every
    example (not of per-batch means), the metric objects' results, and what the epoch-end hooks logged.

    Args:
        trainer: The Trainer (its engine, callbacks, reporter and `steps_per_execution`).
        module: The Module.
        source: The evaluation data.
        runner: The engine's compiled evaluation step (`engine.eval_runner`).
        num_batches: Batches to run; None: until the data ends.
        stage: "val" or "test".
        before_execution: Called before each compiled execution (fit checks for preemption there).

    Returns:
        The epoch metrics, e.g. {"val/loss": 0.31, "val/acc": 0.92}.
    """
    kind = HOOK_NAMES[stage]
    runtime = module_runtime(module)
    reset_metric_objects(module, stage)
    runtime.stage = stage
    getattr(module, f"on_{kind}_epoch_start")()
    call_hook(trainer.callbacks, f"on_{kind}_epoch_start", trainer, module)
    metrics = EpochMetrics(runtime.log_options)
    iterator = trainer.engine.batches(source)
    while num_batches is None or metrics.steps < num_batches:
        if before_execution is not None:
            before_execution()
        wanted = trainer.steps_per_execution
        if num_batches is not None:
            wanted = min(wanted, num_batches - metrics.steps)
        outputs = runner.run(iterator, wanted, metrics.steps)
        ran = len(next(iter(outputs.values())))
        if ran:
            metrics.add(outputs)
        if ran < wanted:
            break
    if metrics.steps == 0 and num_batches != 0:  # the data ran out (limit_val_batches=0 asks for nothing)
        check_training_steps(0, source.num_examples, trainer.batch_size, trainer.engine.replicas, what=source.what)
    results = {**metrics.epoch_metrics(), **metric_object_values(module, stage, epoch=True)}
    runtime.stage = stage
    getattr(module, f"on_{kind}_epoch_end")()
    call_hook(trainer.callbacks, f"on_{kind}_epoch_end", trainer, module)
    results.update(hook_values(runtime.take_logged()))
    trainer.reporter.remember(results, metrics.prog_bar_names())
    return results


def evaluate(trainer: Trainer, module: Module, source: BatchSource, runner: Any, prefix: str) -> dict[str, float]:
    """`Trainer.validate`/`test`: the start hooks, one evaluation run, its metrics logged, the end hooks.

    Returns:
        The epoch metrics, also kept as `trainer.eval_results`.
    """
    kind = HOOK_NAMES[prefix]
    limit = trainer.limit_val_batches if prefix == "val" else None
    call_hook(trainer.callbacks, f"on_{kind}_start", trainer, module)
    metrics = run_evaluation(trainer, module, source, runner, batches_per_epoch(source, limit), prefix)
    trainer.log_metrics(metrics)
    trainer.eval_results = metrics
    call_hook(trainer.callbacks, f"on_{kind}_end", trainer, module)
    return metrics


def predict(trainer: Trainer, module: Module, source: BatchSource) -> Any:
    """`Trainer.predict`: the hooks around the engine's prediction, the batches' results concatenated."""
    call_hook(trainer.callbacks, "on_predict_start", trainer, module)
    chunks = trainer.engine.predict(module, source)
    call_hook(trainer.callbacks, "on_predict_end", trainer, module)
    return keras.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *chunks)
