"""JAX: the training step as a pure function of the training state, run by `jax.jit`.

The user's stateful hooks (`self.model(x, training=True)`, `self.log`, keras.ops, metric objects'
`update_state`) run inside `keras.StatelessScope`, which maps every variable to the value the step
was given and records what the hooks assign (BatchNorm statistics, dropout seed state, metric
state): the same way Keras's own JAX trainer runs `train_step`. The state is two tuples:

- `big`: trainable, non-trainable, optimizer and accumulation values; donated to each call, so the
  step updates them in place. While it is live the Keras variables are stale: `JaxEngine.sync`
  hands it back to them before anything reads them, and the next call takes it from them again,
  so what a callback assigns in between (a learning rate, restored weights) is what trains on.
- `small`: the loss scale and the training metrics' values; not donated, written back to the
  variables after every call (they are a few scalars), so metric results and the scale are current.

Precision is the precision plugin's loss-scale object (`DynamicLossScale` or `NoLossScale`): the
step scales, unscales, checks finiteness and moves the scale through it, with no precision branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import keras

from ktrainer.hooks import call_step_hook, loss_from_return, traced_batch_index
from ktrainer.module import LogOptions
from ktrainer.precision.loss_scale import all_finite
from ktrainer.step_outputs import (
    APPLIED,
    BATCH_SIZE,
    LOSS_SCALE,
    SKIPPED,
    batch_size_of,
    check_loss,
    scalar_logs,
    with_model_losses,
)

__all__ = ["JaxTrainStep", "stateless_values", "current_values"]


def stateless_values(variables: Sequence[Any]) -> list[Any]:
    """The current values of Keras variables, as the arrays a jitted step takes."""
    return [variable.value for variable in variables]


def tracing_scope(module: Any) -> keras.StatelessScope:
    """A stateless scope for tracing the module's hooks abstractly (`jax.eval_shape`) as the step runs them:
    nothing they assign reaches a variable, the model's variables map to their values (a weight regularizer
    asks the scope), and `add_loss` terms are collected."""
    model = module.model
    variables = list(model.variables) if model is not None else []
    mapping = list(zip(variables, stateless_values(variables), strict=True))
    return keras.StatelessScope(state_mapping=mapping, collect_losses=True)  # `add_loss` terms, as in the step


class JaxTrainStep:
    """One optimizer step (or one accumulated batch) as a pure function, and the state it carries.

    Args:
        module: The user's Module (its `model` built).
        optimizer: The optimizer as the precision plugin wrapped it.
        precision: The precision plugin.
        gradient_clip_val: Clip the global gradient norm to this value; None: no clipping.
        accumulate_grad_batches: Batches per optimizer update.

    Raises:
        NotImplementedError: For manual optimization, which runs on TensorFlow only so far.
    """

    stop_flag = None  # processes agree on stopping through the step's outputs (see JaxEngine)

    def __init__(self, module: Any, optimizer: Any, precision: Any, *, gradient_clip_val: float | None,
                 accumulate_grad_batches: int) -> None:
        if not module.automatic_optimization:
            raise NotImplementedError(
                f"{type(module).__name__} uses manual optimization (automatic_optimization = False), which ktrainer "
                "runs on the TensorFlow backend only so far. Set KERAS_BACKEND=tensorflow for it, or let the "
                "Trainer make the update (automatic_optimization = True).")
        self.module = module
        self.optimizer = optimizer
        self.inner = precision.optimizer_to_step(optimizer)
        self.loss_scale = precision.loss_scale_of(optimizer)
        self.clip = gradient_clip_val
        self.accumulate = accumulate_grad_batches
        self.rules: list[Any] = []
        self.big: tuple | None = None  # the live donated state; None while the variables hold it
        self.keys: list[str] = []
        self.batch_spec: Any = None

    # ----- set-up ------------------------------------------------------------------------------

    def build(self) -> None:
        """Build the optimizer on the model's trainable variables and fix the state's variable lists."""
        model = self.module.model
        self.trainable = list(model.trainable_variables)
        self.non_trainable = list(model.non_trainable_variables)
        self.optimizer.build(self.trainable)
        self.optimizer_variables = list(self.inner.variables)
        self.scale_variables = list(self.loss_scale.variables) if self.loss_scale.scaling else []
        self.metric_variables = [v for metric in self.module._metric_objects.get("train", {}).values()
                                 for v in metric.variables]
        self.sums: list[Any] = []
        self.count: Any = None
        if self.accumulate > 1:
            self.sums = [keras.Variable(keras.ops.zeros(v.shape, "float32"), trainable=False, name="accumulated")
                         for v in self.trainable]
            self.count = keras.Variable(0, dtype="int32", trainable=False, name="accumulated_batches")
        self.rules = [SimpleNamespace(optimizer=self.optimizer, variables=self.trainable)]

    def output_keys(self, logged: Sequence[str]) -> list[str]:
        """The step's outputs, in order: what the module logs, the loss scale, and the bookkeeping."""
        scale = []
        if self.loss_scale.scaling:
            scale = [LOSS_SCALE]
            self.module._log_options[LOSS_SCALE] = LogOptions(on_step=True, on_epoch=False, prog_bar=True)
        return [*logged, *scale, BATCH_SIZE, APPLIED, SKIPPED]

    def forward(self, batch: Any, index: Any = None) -> tuple[dict[str, Any], Any]:
        """The module's `training_step` on one batch: (its logs, the loss), inside the caller's scope."""
        module = self.module
        module._stage = "train"
        module._take_logged()
        with traced_batch_index(index):
            returned = loss_from_return(module, call_step_hook(module, "training_step", batch), "training_step",
                                        "train")
        loss = with_model_losses(module, check_loss(returned, "training_step"), "train")
        module.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return scalar_logs(module._take_logged(), "training_step"), loss

    # ----- the state ---------------------------------------------------------------------------

    def _big_variables(self) -> tuple[list, ...]:
        accumulation = [*self.sums, self.count] if self.count is not None else []
        return self.trainable, self.non_trainable, self.optimizer_variables, accumulation

    def _small_variables(self) -> tuple[list, ...]:
        return self.scale_variables, self.metric_variables

    def read_state(self) -> tuple[tuple, tuple]:
        """(big, small): the live big state (read from the variables when there is none), the small one."""
        if self.big is None:
            self.big = tuple(stateless_values(group) for group in self._big_variables())
        return self.big, tuple(stateless_values(group) for group in self._small_variables())

    def write_small(self, small: tuple) -> None:
        """Assign the loss scale and metric values to their variables."""
        for group, values in zip(self._small_variables(), small, strict=True):
            for variable, value in zip(group, values, strict=True):
                variable.assign(value)

    def write_big(self) -> None:
        """Hand the live big state to the variables; the next call reads it from them (and donates it again)."""
        if self.big is None:  # the variables already hold it
            return
        for group, values in zip(self._big_variables(), self.big, strict=True):
            for variable, value in zip(group, values, strict=True):
                variable.assign(value)
        self.big = None

    # ----- the pure step -----------------------------------------------------------------------

    def __call__(self, big: tuple, small: tuple, batch: Any, index: Any) -> tuple[tuple, tuple, Any]:
        """One step as a pure function: (big, small, batch, index) -> (big, small, outputs vector)."""
        trainable, non_trainable, optimizer_values, accumulation = big
        scale_values, metric_values = small
        scale = scale_values[0] if scale_values else None

        def scaled_loss(trainable_values: list) -> tuple[Any, tuple]:
            mapping = [*zip(self.trainable, trainable_values, strict=True),
                       *zip(self.non_trainable, non_trainable, strict=True),
                       *zip(self.metric_variables, metric_values, strict=True)]
            with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
                logs, loss = self.forward(batch, index)
                new_non_trainable = current_values(scope, self.non_trainable, non_trainable)
                new_metrics = current_values(scope, self.metric_variables, metric_values)
            scaled = self.loss_scale.scale(keras.ops.cast(loss, "float32"), scale)
            return scaled, (logs, new_non_trainable, new_metrics)

        gradients, (logs, non_trainable, metric_values) = jax.grad(scaled_loss, has_aux=True)(list(trainable))
        gradients = self.loss_scale.unscale(gradients, scale)
        gradients, due, accumulation = self._accumulate(gradients, accumulation)
        finite = all_finite(gradients)
        gradients = self._clipped(gradients)
        new_trainable, new_optimizer = self.inner.stateless_apply(list(optimizer_values), gradients, list(trainable))
        apply = jnp.logical_and(due, finite) if self.loss_scale.scaling else due
        trainable = _where(apply, new_trainable, trainable)
        optimizer_values = _where(apply, new_optimizer, optimizer_values)
        scale_values = self._moved_scale(scale_values, finite, due)
        skipped = jnp.logical_and(due, jnp.logical_not(finite)) if self.loss_scale.scaling else jnp.zeros((), bool)
        outputs = {**logs}
        if self.loss_scale.scaling:
            outputs[LOSS_SCALE] = jnp.asarray(scale_values[0], jnp.float32)
        outputs[BATCH_SIZE] = batch_size_of(batch)
        outputs[APPLIED] = due.astype(jnp.float32)
        outputs[SKIPPED] = skipped.astype(jnp.float32)
        vector = jnp.stack([jnp.asarray(outputs[key], jnp.float32) for key in self.keys])
        return ((list(trainable), non_trainable, list(optimizer_values), accumulation),
                (scale_values, metric_values), vector)

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

    # ----- accumulation at epoch ends and in checkpoints -----------------------------------------

    def pending(self) -> int:
        """Batches accumulated in the current partial group."""
        if self.count is None:
            return 0
        count = self.big[3][-1] if self.big is not None else self.count.value
        return int(keras.ops.convert_to_numpy(count))

    def flush(self) -> tuple[bool, bool]:
        """Apply the gradients accumulated so far (at an epoch end), as the TensorFlow engine does.

        Returns:
            (stepped, skipped): whether an optimizer step was taken, and whether it was skipped for
            non-finite gradients.
        """
        if self.pending() == 0:
            return False, False
        big, small = self.read_state()
        self.big, small, skipped = jax.jit(self._apply_partial_group, donate_argnums=0)(big, small)
        self.write_small(small)
        return True, bool(skipped)

    def _apply_partial_group(self, big: tuple, small: tuple) -> tuple[tuple, tuple, Any]:
        trainable, non_trainable, optimizer_values, (*sums, count) = big
        scale_values, metric_values = small
        gradients = [total / count.astype(total.dtype) for total in sums]
        finite = all_finite(gradients)
        new_trainable, new_optimizer = self.inner.stateless_apply(list(optimizer_values), self._clipped(gradients),
                                                                  list(trainable))
        apply = finite if self.loss_scale.scaling else jnp.ones((), bool)
        accumulation = [*(jnp.zeros_like(total) for total in sums), jnp.zeros_like(count)]
        big = (_where(apply, new_trainable, trainable), non_trainable, _where(apply, new_optimizer, optimizer_values),
               accumulation)
        skipped = jnp.logical_not(apply)
        return big, (self._moved_scale(scale_values, finite, jnp.ones((), bool)), metric_values), skipped

    def state_dict(self) -> dict[str, Any]:
        """The partial accumulation group (empty without one)."""
        if self.pending() == 0:
            return {}
        return {"00": {"count": self.count, "sums": {f"{i:05d}": total for i, total in enumerate(self.sums)}}}

    def mismatch(self, state: dict[str, Any]) -> str:
        """Why a saved partial group does not fit this step ("" when it does, or there is none)."""
        if not state:
            return ""
        saved = state.get("00", {})
        if self.accumulate == 1 or len(saved.get("sums", {})) != len(self.sums):
            return (f"The checkpoint holds a partial gradient-accumulation group; this run accumulates "
                    f"{self.accumulate} batches over {len(self.sums)} variables. Resume with the same "
                    "accumulate_grad_batches (and model).")
        return ""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a partial group (after `mismatch` found none)."""
        saved = state.get("00")
        if not saved:
            return
        for total, value in zip(self.sums, saved["sums"].values(), strict=True):
            total.assign(value)
        self.count.assign(int(saved["count"]))
        self.big = None


def current_values(scope: Any, variables: Sequence[Any], given: Sequence[Any]) -> list[Any]:
    """What a `keras.StatelessScope` holds for each variable after the hooks ran: assigned, or as given."""
    values = [scope.get_current_value(variable) for variable in variables]
    return [old if value is None else value for value, old in zip(values, given, strict=True)]


def _where(condition: Any, new: Sequence[Any], old: Sequence[Any]) -> list[Any]:
    return [jnp.where(condition, n, o) for n, o in zip(new, old, strict=True)]
