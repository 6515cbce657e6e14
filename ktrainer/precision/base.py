"""The precision plugin interface: a few hooks, each a no-op here, overridden where a precision needs it."""

from __future__ import annotations

from typing import Any

__all__ = ["Precision"]


class Precision:
    """Full float32 precision, and the hooks other precisions override.

    The Trainer calls `policy_name` before `Module.build()`, `wrap_optimizer` after
    `configure_optimizers()`, and `scale_loss` / `unscale_gradients` inside the compiled step.
    Here they do nothing, so the step has no precision branches.

    Args:
        name: The precision string this plugin stands for, e.g. "32-true".
    """

    policy: str = "float32"

    def __init__(self, name: str = "32-true") -> None:
        self.name = name

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Return the optimizer the step should use (unchanged here)."""
        return optimizer

    def scale_loss(self, loss: Any, optimizer: Any) -> Any:
        """Return the loss to differentiate (unchanged here)."""
        return loss

    def unscale_gradients(self, gradients: list, optimizer: Any) -> list:
        """Return the true gradients from the gradients of the scaled loss (unchanged here)."""
        return gradients

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
