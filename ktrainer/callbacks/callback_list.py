"""Calling a hook on a run's callbacks, in the order the hook calls them (`Callback.runs_first_in`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["call_hook", "in_hook_order"]


def in_hook_order(callbacks: list, hook: str) -> list:
    """The callbacks in the order `hook` calls them: those naming it in `runs_first_in` first, then the rest,
    each group in list order."""
    def runs_first(callback: Any) -> bool:
        return hook in getattr(callback, "runs_first_in", ())

    first = [callback for callback in callbacks if runs_first(callback)]
    if not first:
        return callbacks
    return first + [callback for callback in callbacks if not runs_first(callback)]


def call_hook(callbacks: list, hook: str, trainer: Trainer, module: Module, *args: Any) -> None:
    """Call `hook` on every callback, in hook order (`in_hook_order`)."""
    for callback in in_hook_order(callbacks, hook):
        getattr(callback, hook)(trainer, module, *args)
