"""JAX: one optimizer updating one list of variables, as pure arithmetic on their values.

A rule owns what an update needs besides the variables: the optimizer's variables, the loss scale
of the precision plugin (`DynamicLossScale` or `NoLossScale`), and a partial gradient-accumulation
group. With automatic optimization a step has one rule over the model's trainable variables; with
manual optimization each `self.manual_step(loss_fn, optimizer, variables)` has its own, as on
TensorFlow (tensorflow/train_step.py's `UpdateRule`), so each keeps its own loss scale and skips
its own non-finite steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import keras

from ktrainer.compat.keras_internals import variable_layout
from ktrainer.precision.loss_scale import all_finite
from ktrainer.step.accumulation import PartialGroup

__all__ = ["JaxUpdateRule"]


class JaxUpdateRule(PartialGroup):
    """One optimizer over one list of variables: accumulation, the skip decision, clipping, the update.

    Args:
        optimizer: The optimizer, as the precision plugin wrapped it.
        variables: The variables it updates.
        precision: The precision plugin.
        clip: The global norm to clip to, or None.
        accumulate: Batches per update.
    """

    def __init__(self, optimizer: Any, variables: Sequence[Any], precision: Any, clip: float | None,
                 accumulate: int) -> None:
        self.optimizer = optimizer
        self.variables = list(variables)
        self.inner = precision.optimizer_to_step(optimizer)
        self.loss_scale = precision.loss_scale_of(optimizer)
        self.clip = clip
        self.accumulate = accumulate
        self.sums: list[Any] = []
        self.count: Any = None

    def build(self) -> None:
        """Build the optimizer on the variables; create the accumulation variables."""
        self.optimizer.build(self.variables)
        self.optimizer_variables = list(self.inner.variables)
        self.scale_variables = list(self.loss_scale.variables) if self.loss_scale.scaling else []
        if self.accumulate > 1:
            self.sums = [keras.Variable(keras.ops.zeros(v.shape, "float32"), trainable=False, name="accumulated",
                                        layout=variable_layout(v))  # sharded as its variable
                         for v in self.variables]
            self.count = keras.Variable(0, dtype="int32", trainable=False, name="accumulated_batches")

    @property
    def accumulation_variables(self) -> list[Any]:
        """The partial group's sums and count (empty without accumulation)."""
        return [*self.sums, self.count] if self.count is not None else []

    # ----- pure arithmetic (inside the jitted step) -------------------------------------------------

    def update(self, gradients: list, values: list, optimizer_values: list, accumulation: list,
               scale_values: list) -> tuple[list, list, list, list, Any, Any]:
        """Accumulate the unscaled `gradients`; at a group's end apply them unless non-finite under a loss scale.

        Returns:
            (values, optimizer_values, accumulation, scale_values, due, skipped): the new state, whether
            this batch ended a group, and whether that group's update was skipped.
        """
        gradients, due, accumulation = self._accumulate(gradients, accumulation)
        return self._decide(gradients, values, optimizer_values, accumulation, scale_values, due)

    def flush(self, values: list, optimizer_values: list, accumulation: list,
              scale_values: list) -> tuple[list, list, list, list, Any, Any]:
        """Apply the partial group accumulated so far (at an epoch end); returns as `update` does."""
        *sums, count = accumulation
        gradients = [total / count.astype(total.dtype) for total in sums]
        emptied = [*(jnp.zeros_like(total) for total in sums), jnp.zeros_like(count)]
        return self._decide(gradients, values, optimizer_values, emptied, scale_values, jnp.ones((), bool))

    def _decide(self, gradients: list, values: list, optimizer_values: list, accumulation: list,
                scale_values: list, due: Any) -> tuple[list, list, list, list, Any, Any]:
        finite = all_finite(gradients)
        gradients = self._clipped(gradients)
        new_values, new_optimizer = self.inner.stateless_apply(list(optimizer_values), gradients, list(values))
        scaling = self.loss_scale.scaling
        apply = jnp.logical_and(due, finite) if scaling else due
        skipped = jnp.logical_and(due, jnp.logical_not(finite)) if scaling else jnp.zeros((), bool)
        return (_where(apply, new_values, values), _where(apply, new_optimizer, optimizer_values), accumulation,
                self._moved_scale(scale_values, finite, due), due, skipped)

    def _accumulate(self, gradients: list, accumulation: list) -> tuple[list, Any, list]:
        if self.accumulate == 1:
            return gradients, jnp.ones((), bool), accumulation
        *sums, count = accumulation
        sums = [total + g.astype(total.dtype) for total, g in zip(sums, gradients, strict=True)]
        count = count + 1
        due = count >= self.accumulate
        mean = [total / count.astype(total.dtype) for total in sums]
        sums = [jnp.where(due, jnp.zeros_like(total), total) for total in sums]
        return mean, due, [*sums, jnp.where(due, 0, count)]

    def _clipped(self, gradients: list) -> list:
        if self.clip is None:
            return gradients
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in gradients))
        factor = jnp.minimum(1.0, self.clip / jnp.maximum(norm, 1e-12))
        return [g * factor.astype(g.dtype) for g in gradients]

    def _moved_scale(self, scale_values: list, finite: Any, due: Any) -> list:
        if not self.loss_scale.scaling:
            return scale_values
        scale, counter = scale_values
        moved_scale, moved_counter = self.loss_scale.next_state(finite, scale, counter)
        return [jnp.where(due, moved_scale, scale), jnp.where(due, moved_counter, counter)]

    # ----- the partial group in checkpoints ----------------------------------------------------------

    def pending(self, count: Any = None) -> int:
        """Batches in the partial group: of `count` (a live value) or of the variable (a checkpoint's layout and
        checks: `PartialGroup`)."""
        if self.count is None:
            return 0
        return int(keras.ops.convert_to_numpy(self.count.value if count is None else count))


def _where(condition: Any, new: Sequence[Any], old: Sequence[Any]) -> list[Any]:
    return [jnp.where(condition, n, o) for n, o in zip(new, old, strict=True)]
