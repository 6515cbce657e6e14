"""What a checkpoint holds of a run (`Trainer.state_dict`), and putting it back (`Trainer.load_state_dict`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ktrainer.checkpoint.io import CheckpointError
from ktrainer.checkpoint.variables import assign_all, keyed, mismatches, refuse_mismatches
from ktrainer.step.metrics import metric_objects
from ktrainer.trainer.random_state import capture_random_state, restore_random_state
from ktrainer.trainer.resume_checks import adopt_class_keys, check_global_batch, check_keys, unique_keys

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["trainer_state_dict", "load_trainer_state_dict", "optimizer_variables"]

log = logging.getLogger("ktrainer")


def optimizer_variables(optimizers: list) -> list:
    """Every optimizer's variables, in `configure_optimizers` order."""
    return [variable for optimizer in optimizers for variable in optimizer.variables]


def trainer_state_dict(trainer: Trainer, module: Module, train_step: Any) -> dict[str, Any]:
    """The state of a fit in progress, by section (see `Trainer.state_dict`); the engine's live state synced first."""
    trainer.engine.sync()
    return {
        "model": keyed(module.model.variables),
        "optimizer": keyed(optimizer_variables(trainer.optimizers)),
        "accumulation": train_step.state_dict(),
        "progress": trainer.progress.state_dict(),
        "random": capture_random_state(),
        "callbacks": {key: cb.state_dict() for key, cb in unique_keys(trainer.callbacks).items()},
        "loggers": {key: lg.state_dict() for key, lg in unique_keys(trainer.reporter.writing_loggers).items()},
        "precision": trainer.precision.state_dict(),
        "metrics": {name: list(metric.variables) for name, metric in metric_objects(module, "train").items()},
        "run": {"run_id": trainer.run.run_id, "lineage": list(trainer.run.lineage), "parent": trainer.run.parent,
                "global_batch_size": trainer.global_batch_size, "precision": trainer.precision.name,
                "hparams": _jsonable(module.hparams), "shuffle": trainer.shuffle},
    }


def load_trainer_state_dict(trainer: Trainer, module: Module, train_step: Any, state: dict[str, Any],
                            copy: bool = True) -> None:
    """Put a state back into a built fit: every check first, then all of it, or nothing (`Trainer.load_state_dict`;
    `copy=False`: the arrays are given away, and the variables may use their memory in place).

    Raises:
        ValueError: When the state does not fit this model, optimizer or global batch size.
    """
    problems = (mismatches("model", state["model"], module.model.variables)
                + mismatches("optimizer", state["optimizer"], optimizer_variables(trainer.optimizers)))
    accumulation = train_step.mismatch(state.get("accumulation", {}))
    if accumulation:
        problems.append(accumulation)
    refuse_mismatches(problems, "this model and optimizer")
    progress = check_global_batch(state["progress"], state["run"]["global_batch_size"], trainer.global_batch_size,
                                  trainer.allow_global_batch_change)
    components = {"callbacks": unique_keys(trainer.callbacks), "loggers": unique_keys(trainer.reporter.writing_loggers)}
    saved = {section: adopt_class_keys(state.get(section, {}), present) for section, present in components.items()}
    check_keys("callbacks", saved["callbacks"], components["callbacks"])
    if trainer.is_global_zero:
        check_keys("loggers", saved["loggers"], components["loggers"])

    host_value = functools.partial(trainer.engine.host_value, give_away=not copy)
    _assign_in_every_process(trainer, [(state["model"], module.model.variables),
                                       (state["optimizer"], optimizer_variables(trainer.optimizers))], host_value)
    train_step.load_state_dict(state.get("accumulation", {}))
    trainer.progress.load_state_dict(progress)
    for section, present in components.items():
        for key, component in present.items():
            if key in saved[section]:
                component.load_state_dict(saved[section][key])
    trainer.precision.load_state_dict(state.get("precision", {}))
    for name, metric in metric_objects(module, "train").items():
        saved_metric = state.get("metrics", {}).get(name)
        if saved_metric is not None and len(saved_metric) == len(metric.variables):
            for variable, value in zip(metric.variables, saved_metric, strict=True):
                variable.assign(host_value(variable, value))
    restore_random_state(state["random"])
    trainer.engine.reload()
    if state["run"]["precision"] != trainer.precision.name:
        log.warning("Resuming a %s checkpoint under precision=%r.", state["run"]["precision"], trainer.precision.name)


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, bool | int | float | str | type(None)) else str(v) for k, v in values.items()}


def _assign_in_every_process(trainer: Trainer, pairs: list[tuple[dict[str, Any], list[Any]]],
                             host_value: Callable[[Any, Any], Any]) -> None:
    """Assign each (saved arrays, variables) pair; every process learns whether any failed, so all raise.

    A sharded checkpoint's slices are read and checked while they are placed, each process its own: one
    process can find a corrupt slice the others never read, and had it raised alone they would wait for it
    in their next collective forever.

    Raises:
        CheckpointError: In every process, when one failed to read its slices.
    """
    failure = ""
    try:
        for saved, variables in pairs:
            assign_all(saved, variables, trainer.engine.place_slices, host_value)
    except CheckpointError as error:
        failure = str(error)
    failures = [each for each in trainer.engine.gather_json(failure) if each]
    if failures:
        raise CheckpointError(failures[0])
