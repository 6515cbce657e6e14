"""Mixed precision: float32 variables, float16 or bfloat16 compute; dynamic loss scaling for float16."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import keras

from ktrainer.checks import check_choice, check_int
from ktrainer.precision.base import Precision
from ktrainer.precision.loss_scale import DynamicLossScale, NoLossScale

__all__ = ["MixedPrecision", "TrainingStalledError"]


class TrainingStalledError(RuntimeError):
    """Raised when loss scaling skips every step of a window, or the loss scale falls below its floor."""


class MixedPrecision(Precision):
    """Variables in float32, compute in float16 ("16-mixed") or bfloat16 ("bf16-mixed").

    Under "16-mixed" the optimizer is wrapped in `keras.mixed_precision.LossScaleOptimizer`
    (unless it already is one, whose settings are then kept). The Trainer's step scales the
    loss, unscales the gradients once, and skips the update when any gradient is non-finite on
    any replica: weights, slots and the iteration count stay as they were, and the scale halves;
    after `growth_interval` finite steps it doubles. bfloat16 has float32's range and needs none
    of this.

    Args:
        precision: "16-mixed" or "bf16-mixed".
        initial_scale: The first loss scale ("16-mixed").
        growth_interval: Finite steps in a row before the scale doubles ("16-mixed").
        stall_window: Stop with `TrainingStalledError` when this many optimizer steps in a row
            were all skipped.
        min_loss_scale: Stop with `TrainingStalledError` when the scale falls below this.

    Raises:
        ValueError: For an unknown precision or a bad setting.
    """

    def __init__(self, precision: str = "16-mixed", *, initial_scale: float = 2.0**15, growth_interval: int = 2000,
                 stall_window: int = 100, min_loss_scale: float = 2.0**-10) -> None:
        super().__init__(check_choice("precision", precision, ("16-mixed", "bf16-mixed")))
        half = "float16" if precision == "16-mixed" else "bfloat16"
        self.policy, self.compute_dtype = f"mixed_{half}", half
        self.loss_scaling = precision == "16-mixed"
        if not (isinstance(initial_scale, int | float) and initial_scale > 0 and math.isfinite(initial_scale)):
            raise ValueError(f"initial_scale must be a finite number > 0, got {initial_scale!r}.")
        self.initial_scale = float(initial_scale)
        self.growth_interval = check_int("growth_interval", growth_interval, minimum=1)
        self.stall_window = check_int("stall_window", stall_window, minimum=1)
        self.min_loss_scale = float(min_loss_scale)
        self._recent_skips: deque[bool] = deque(maxlen=self.stall_window)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Wrap in a LossScaleOptimizer under "16-mixed" (unless it is one); unwrap under "bf16-mixed"."""
        if not self.loss_scaling:
            return super().wrap_optimizer(optimizer)
        if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
            return optimizer
        return keras.mixed_precision.LossScaleOptimizer(
            optimizer, initial_scale=self.initial_scale, dynamic_growth_steps=self.growth_interval)

    def loss_scale_of(self, optimizer: Any) -> DynamicLossScale | NoLossScale:
        """A `DynamicLossScale` over the LossScaleOptimizer's variables ("16-mixed"), else `NoLossScale`."""
        return DynamicLossScale(optimizer) if self.loss_scaling else NoLossScale()

    def optimizer_to_step(self, optimizer: Any) -> Any:
        """The inner optimizer under "16-mixed": the gradients reaching it are already unscaled."""
        return optimizer.inner_optimizer if self.loss_scaling else optimizer

    def watch(self, skipped: Sequence[int], loss_scale: float | None) -> None:
        """Check the steps just run for a stall (Python, between compiled calls).

        Args:
            skipped: One flag per optimizer step just taken, 1 where it was skipped.
            loss_scale: The loss scale after these steps.

        Raises:
            TrainingStalledError: When the last `stall_window` steps were all skipped, or the
                loss scale fell below `min_loss_scale`.
        """
        self._recent_skips.extend(bool(s) for s in skipped)
        window_full = len(self._recent_skips) == self.stall_window
        if window_full and all(self._recent_skips):
            raise TrainingStalledError(
                f"Training stalled under precision={self.name!r}: the last {self.stall_window} optimizer steps "
                "were all skipped because their gradients were not finite (inf or NaN), so the weights have not "
                "changed. Confirm with precision='32-true': if the loss is NaN there too, the model or data is "
                "at fault; if not, keep numerically sensitive layers in float32 with "
                "Trainer(float32_layers=[...]) (normalization layers, large reductions, the output layer)."
            )
        if loss_scale is not None and loss_scale < self.min_loss_scale:
            raise TrainingStalledError(
                f"Training stalled under precision={self.name!r}: the loss scale fell to {loss_scale:.3g}, below "
                f"the floor {self.min_loss_scale:.3g}, after repeated non-finite gradients. Confirm with "
                "precision='32-true', keep sensitive layers in float32 with Trainer(float32_layers=[...]), or "
                "try precision='bf16-mixed', which needs no loss scaling."
            )

    def reset(self) -> None:
        """Forget the skip history (at the start of each fit)."""
        self._recent_skips.clear()

    def state_dict(self) -> dict[str, Any]:
        """The skip flags of the last `stall_window` steps, so stall detection spans a resume."""
        return {"recent_skips": [int(s) for s in self._recent_skips]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the skip history."""
        self._recent_skips.clear()
        self._recent_skips.extend(bool(s) for s in state.get("recent_skips", []))
