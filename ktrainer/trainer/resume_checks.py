"""The Trainer's stateful components: unique keys in a checkpoint, and the checks a resume needs first."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ktrainer.utils.logs import warn_user

__all__ = ["unique_keys", "adopt_class_keys", "check_keys", "check_global_batch", "check_checkpoint_dirs"]

log = logging.getLogger("ktrainer")


def unique_keys(components: Sequence[Any]) -> dict[str, Any]:
    """Each component by its `state_key`; a key held by several is numbered in order (`key`, `key#2`, ...)."""
    keyed: dict[str, Any] = {}
    for component in components:
        key = component.state_key
        number = 1
        while (key if number == 1 else f"{key}#{number}") in keyed:
            number += 1
        keyed[key if number == 1 else f"{key}#{number}"] = component
    return keyed


def adopt_class_keys(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Saved states keyed by a bare class name (format 1), re-keyed to this run's only component of that class."""
    adopted = dict(saved)
    for key in saved:
        if key in current or "{" in key:
            continue
        same_class = [name for name in current if name.split("{", 1)[0].split("#", 1)[0] == key]
        if len(same_class) == 1 and same_class[0] not in saved:
            adopted[same_class[0]] = adopted.pop(key)
    return adopted


def check_keys(section: str, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Warn, naming them, about saved states nobody takes and components that get no saved state.

    Stateless components (a progress bar) are left out: adding or dropping one changes nothing.
    """
    orphaned = sorted(key for key in set(saved) - set(current) if saved[key])
    fresh = sorted(key for key in set(current) - set(saved) if current[key].state_dict())
    if orphaned or fresh:
        parts = []
        if orphaned:
            parts.append(f"the checkpoint has state for {section} this run does not have (ignored): {orphaned}")
        if fresh:
            parts.append(f"{section} of this run with no state in the checkpoint (they start fresh): {fresh}")
        warn_user("Resuming: " + "; ".join(parts) + ". Give the Trainer the same callbacks and loggers (with "
                  "the same arguments) as the run that saved it to continue them.")


def check_global_batch(progress: dict[str, Any], saved: int, current: int, allow_change: bool) -> dict[str, Any]:
    """The saved progress, checked against the global batch size (mapped to the new one when allowed).

    Raises:
        ValueError: When the sizes differ and the change is not allowed, naming both and the override.
    """
    if saved == current:
        return progress
    if not allow_change:
        raise ValueError(
            f"The checkpoint was saved with a global batch of {saved} examples per step; this run's global batch is "
            f"{current} (batch_size x replicas). The data position and the learning rate depend on it, so the run "
            f"would not continue as it was. Resume with the same batch_size and devices, or pass "
            f"Trainer(allow_global_batch_change=True) to continue from the same example with the new size."
        )
    examples = int(progress["batch_in_epoch"]) * saved
    mapped = {**progress, "batch_in_epoch": examples // current}
    if "batches_trained" in progress:  # the run's count, in batches of the new size (val_check_interval's rhythm)
        mapped["batches_trained"] = int(progress["batches_trained"]) * saved // current
    log.warning("Resuming with a global batch of %d instead of %d: the epoch continues at batch %d (example %d).",
                current, saved, mapped["batch_in_epoch"], mapped["batch_in_epoch"] * current)
    return mapped


def check_checkpoint_dirs(callbacks: Sequence[Any], default_root_dir: str, storage_options: dict[str, Any]) -> None:
    """Refuse two ModelCheckpoints writing to one directory: each would delete the other's checkpoints.

    Raises:
        ValueError: Naming the shared dirpath.
    """
    seen: dict[str, Any] = {}
    for callback in callbacks:
        resolve = getattr(callback, "resolve_location", None)
        if resolve is None:
            continue
        where = resolve(default_root_dir, storage_options).canonical_url
        if where in seen:
            raise ValueError(
                f"Two ModelCheckpoint callbacks write to the same dirpath {where!r}; each would apply its retention "
                "to the other's checkpoints. Give each its own dirpath=..., or merge them into one."
            )
        seen[where] = callback
