"""The precision plugin interface: a few hooks, each a no-op here, overridden where a precision needs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from ktrainer.precision.loss_scale import NoLossScale
from ktrainer.utils.logs import warn_user

__all__ = ["Precision"]


class Precision:
    """Full float32 precision ("32-true"), and the hooks other precisions override.

    The Trainer sets `policy` before `Module.build()`, calls `wrap_optimizer` after
    `configure_optimizers()`, and inside the compiled step `scale_loss`, `unscale_gradients`
    and `apply`. Here they do nothing, so the step has no precision branches.

    Args:
        name: The precision string this plugin stands for.
    """

    policy: str = "float32"
    compute_dtype: str = "float32"
    loss_scaling: bool = False

    def __init__(self, name: str = "32-true") -> None:
        self.name = name

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Return the optimizer the step uses. A LossScaleOptimizer is unwrapped: it is not needed here."""
        if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
            warn_user(
                f"configure_optimizers() returned a LossScaleOptimizer, but precision={self.name!r} needs no "
                "loss scaling; the Trainer uses its inner optimizer. Loss scaling is for precision='16-mixed'.")
            return optimizer.inner_optimizer
        return optimizer

    def loss_scale_of(self, optimizer: Any) -> Any:
        """The loss scale the step uses with `optimizer`: `NoLossScale` here (see `precision.loss_scale`)."""
        return NoLossScale()

    def optimizer_to_step(self, optimizer: Any) -> Any:
        """The optimizer whose `apply` receives the (already unscaled) gradients."""
        return optimizer

    def scale_loss(self, loss: Any, optimizer: Any) -> Any:
        """The loss to differentiate: the loss times the current scale (unchanged without loss scaling)."""
        return self.loss_scale_of(optimizer).scale(loss)

    def unscale_gradients(self, gradients: list, optimizer: Any) -> list:
        """The true gradients from those of the scaled loss, once (sparse gradients stay sparse)."""
        return self.loss_scale_of(optimizer).unscale(gradients)

    def apply(self, optimizer: Any, apply: Callable[[], None], finite: Any) -> Any:
        """Run the update unless a loss scale finds the gradients non-finite; move the scale either way.

        Without loss scaling the update always runs: a non-finite gradient is then the model's own
        result, as in plain training. With it, a skipped step leaves weights, optimizer slots and the
        iteration count untouched. Call it where a conditional may run the optimizer (the
        cross-replica context on TensorFlow).

        Args:
            optimizer: The optimizer returned by `wrap_optimizer`.
            apply: Runs the update (on every replica).
            finite: A boolean scalar: every gradient is finite on every replica.

        Returns:
            1.0 if the step was skipped, else 0.0 (float32).
        """
        loss_scale = self.loss_scale_of(optimizer)
        if not loss_scale.scaling:
            apply()
            return keras.ops.convert_to_tensor(0.0, "float32")

        def step() -> Any:
            apply()
            loss_scale.update(True)
            return keras.ops.convert_to_tensor(0.0, "float32")

        def skip() -> Any:
            loss_scale.update(False)
            return keras.ops.convert_to_tensor(1.0, "float32")

        return keras.ops.cond(finite, step, skip)

    def loss_scale(self, optimizer: Any) -> Any:
        """The current loss scale, or None when the precision does not scale the loss."""
        return self.loss_scale_of(optimizer).value()

    def watch(self, skipped: Any, loss_scale: float | None) -> None:
        """Check the steps just run for a stall (nothing to check here).

        Args:
            skipped: One flag per optimizer step just taken, 1 where it was skipped.
            loss_scale: The loss scale after these steps, or None.
        """

    def reset(self) -> None:
        """Forget what `watch` has seen (at the start of each fit)."""

    def state_dict(self) -> dict[str, Any]:
        """What `watch` has seen, for checkpoints (nothing here)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
