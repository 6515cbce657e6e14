"""JAX: the training step as a pure function of the training state, run by `jax.jit`.

The user's stateful hooks (`self.model(x, training=True)`, `self.log`, keras.ops, metric objects'
`update_state`) run inside `keras.StatelessScope`, which maps every variable to the value the step
was given and records what the hooks assign (BatchNorm statistics, dropout seed state, metric
state): the same way Keras's own JAX trainer runs `train_step`. The state is two tuples:

- `big`: trainable, non-trainable, optimizer and accumulation values (the last two per update rule,
  see update_rule.py); donated to each call, so the
  step updates them in place. While it is live the Keras variables are stale: `JaxEngine.sync`
  hands it back to them before anything reads them, and the next call takes it from them again,
  so what a callback assigns in between (a learning rate, restored weights) is what trains on.
- `small`: the loss scales (per rule) and the training metrics' values; not donated, written back to the
  variables after every call (they are a few scalars), so metric results and the scale are current.

Precision is the precision plugin's loss-scale object (`DynamicLossScale` or `NoLossScale`): the
step scales, unscales, checks finiteness and moves the scale through it, with no precision branch.

Manual optimization (`automatic_optimization = False`): `training_step` runs in one stateless scope
over the whole state, and each `self.manual_step(loss_fn, optimizer, variables)` differentiates
`loss_fn` with `jax.grad` in a scope of its own over the values current at that point, updates
through its rule and writes the new values back into the outer scope: a GAN's generator update
sees the discriminator its own step just updated, as on TensorFlow. Each optimizer updates one list
of variables per step (a Keras optimizer's stateless update takes all the variables it was built on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import keras

from ktrainer.backends.jax.update_rule import JaxUpdateRule
from ktrainer.module import LogOptions, module_runtime
from ktrainer.step.accumulation import groups_mismatch, groups_state_dict, load_groups
from ktrainer.step.hooks import NO_UPDATE, call_step_hook, loss_from_return, traced_batch_index, wrapped_optimizer
from ktrainer.step.metrics import metric_objects
from ktrainer.step.outputs import (
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


@dataclass
class _Live:
    """The state inside one traced step (lists, so an update can replace entries)."""

    trainable: list
    non_trainable: list
    optimizers: list
    accumulation: list
    scales: list
    metrics: list
    scope: Any = None
    flags: list = field(default_factory=list)  # (due, skipped) of each update made

    @classmethod
    def of(cls, big: tuple, small: tuple) -> _Live:
        trainable, non_trainable, optimizers, accumulation = big
        scales, metrics = small
        return cls(list(trainable), list(non_trainable), [list(v) for v in optimizers],
                   [list(v) for v in accumulation], [list(v) for v in scales], list(metrics))

    def state(self) -> tuple[tuple, tuple]:
        return (self.trainable, self.non_trainable, self.optimizers, self.accumulation), (self.scales, self.metrics)


class JaxTrainStep:
    """One training step (or one accumulated batch) as a pure function, and the state it carries.

    Args:
        module: The user's Module (its `model` built).
        optimizers: The optimizers as the precision plugin wrapped them, in `configure_optimizers` order.
        configured: The user's own optimizer objects, in the same order (what `manual_step` is given).
        precision: The precision plugin.
        gradient_clip_val: Clip the global gradient norm to this value; None: no clipping.
        accumulate_grad_batches: Batches per optimizer update.
    """

    stop_flag = None  # processes agree on stopping through the step's outputs (see JaxEngine)

    def __init__(self, module: Any, optimizers: Sequence[Any], configured: Sequence[Any], precision: Any, *,
                 gradient_clip_val: float | None, accumulate_grad_batches: int) -> None:
        self.module = module
        self.optimizers = list(optimizers)
        self.configured = list(configured)
        self.precision = precision
        self.clip = gradient_clip_val
        self.accumulate = accumulate_grad_batches
        self.automatic = module.automatic_optimization
        self.rules: list[JaxUpdateRule] = []
        self.big: tuple | None = None  # the live donated state; None while the variables hold it
        self.keys: list[str] = []
        self.batch_spec: Any = None
        self._live: _Live | None = None  # set while a step is traced; None while rules are discovered

    # ----- set-up ------------------------------------------------------------------------------

    def build(self) -> None:
        """Build each rule's optimizer and state, and fix the state's variable lists (after `forward` was traced
        once, which shows a manual step's rules).

        Raises:
            ValueError: When one optimizer updates two lists of variables, or `training_step` made no update.
        """
        model = self.module.model
        if self.automatic:
            self.rules = [JaxUpdateRule(self.optimizers[0], model.trainable_variables, self.precision, self.clip,
                                        self.accumulate)]
        if not self.rules:
            raise ValueError(NO_UPDATE)
        self.trainable = list(model.trainable_variables)
        for rule in self.rules:
            self.trainable += [v for v in rule.variables if all(v is not known for known in self.trainable)]
            rule.build()
        self.positions = [[_index(self.trainable, v) for v in rule.variables] for rule in self.rules]
        self.non_trainable = list(model.non_trainable_variables)
        self.metric_variables = [v for metric in metric_objects(self.module, "train").values()
                                 for v in metric.variables]

    def output_keys(self, logged: Sequence[str]) -> list[str]:
        """The step's outputs, in order: what the module logs, the loss scale, and the bookkeeping."""
        scale = []
        if self.rules and self.rules[0].loss_scale.scaling:
            scale = [LOSS_SCALE]
            shown = LogOptions(on_step=True, on_epoch=False, prog_bar=True)
            module_runtime(self.module).log_options[LOSS_SCALE] = shown
        return [*logged, *scale, BATCH_SIZE, APPLIED, SKIPPED]

    def forward(self, batch: Any, index: Any = None) -> tuple[dict[str, Any], Any]:
        """The module's `training_step` on one batch: (its logs, the loss), inside the caller's scope. With
        manual optimization its `manual_step` calls make the updates (or, outside a step, name the rules)."""
        module = self.module
        runtime = module_runtime(module)
        with runtime.step_hook("train", manual=self), traced_batch_index(index):
            returned = loss_from_return(module, call_step_hook(module, "training_step", batch), "training_step",
                                        "train")
        if self.automatic:
            loss = with_model_losses(module, check_loss(returned, "training_step"), "train")
        else:
            loss = None if returned is None else check_loss(returned, "training_step")
        if loss is not None:
            module.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return scalar_logs(runtime.take_logged(), "training_step"), loss

    # ----- the state ---------------------------------------------------------------------------

    def _big_variables(self) -> tuple[list, ...]:
        return (self.trainable, self.non_trainable, [r.optimizer_variables for r in self.rules],
                [r.accumulation_variables for r in self.rules])

    def _small_variables(self) -> tuple[list, ...]:
        return [r.scale_variables for r in self.rules], self.metric_variables

    def read_state(self) -> tuple[tuple, tuple]:
        """(big, small): the live big state (read from the variables when there is none), the small one."""
        if self.big is None:
            self.big = _map(stateless_values, self._big_variables())
        return self.big, _map(stateless_values, self._small_variables())

    def write_small(self, small: tuple) -> None:
        """Assign the loss scales and metric values to their variables."""
        _assign(self._small_variables(), small)

    def write_big(self) -> None:
        """Hand the live big state to the variables; the next call reads it from them (and donates it again)."""
        if self.big is None:  # the variables already hold it
            return
        _assign(self._big_variables(), self.big)
        self.big = None

    # ----- the pure step -----------------------------------------------------------------------

    def __call__(self, big: tuple, small: tuple, batch: Any, index: Any) -> tuple[tuple, tuple, Any]:
        """One step as a pure function: (big, small, batch, index) -> (big, small, outputs vector)."""
        live = _Live.of(big, small)
        logs = self._automatic(live, batch, index) if self.automatic else self._manual(live, batch, index)
        outputs = {**logs}
        if self.rules[0].loss_scale.scaling:
            outputs[LOSS_SCALE] = jnp.asarray(live.scales[0][0], jnp.float32)
        outputs[BATCH_SIZE] = batch_size_of(batch)
        outputs[APPLIED] = jnp.max(jnp.stack([due for due, _ in live.flags])).astype(jnp.float32)
        outputs[SKIPPED] = jnp.max(jnp.stack([skipped for _, skipped in live.flags])).astype(jnp.float32)
        vector = jnp.stack([jnp.asarray(outputs[key], jnp.float32) for key in self.keys])
        return *live.state(), vector

    def _mapping(self, live: _Live) -> list[tuple[Any, Any]]:
        return [*zip(self.trainable, live.trainable, strict=True),
                *zip(self.non_trainable, live.non_trainable, strict=True),
                *zip(self.metric_variables, live.metrics, strict=True)]

    def _automatic(self, live: _Live, batch: Any, index: Any) -> dict[str, Any]:
        rule = self.rules[0]
        scale = live.scales[0][0] if rule.loss_scale.scaling else None

        def scaled_loss(trainable_values: list) -> tuple[Any, tuple]:
            live.trainable = trainable_values
            with keras.StatelessScope(state_mapping=self._mapping(live), collect_losses=True) as scope:
                logs, loss = self.forward(batch, index)
                non_trainable = current_values(scope, self.non_trainable, live.non_trainable)
                metrics = current_values(scope, self.metric_variables, live.metrics)
            return rule.loss_scale.scale(keras.ops.cast(loss, "float32"), scale), (logs, non_trainable, metrics)

        values = live.trainable
        gradients, (logs, live.non_trainable, live.metrics) = jax.grad(scaled_loss, has_aux=True)(values)
        live.trainable = values
        self._update(live, 0, rule.loss_scale.unscale(gradients, scale))
        return logs

    def _manual(self, live: _Live, batch: Any, index: Any) -> dict[str, Any]:
        with keras.StatelessScope(state_mapping=self._mapping(live), collect_losses=True) as scope:
            live.scope, self._live = scope, live
            try:
                logs, _ = self.forward(batch, index)
            finally:
                self._live = None
            self._read_scope(live)
        if not live.flags:
            raise ValueError(NO_UPDATE)
        return logs

    def _read_scope(self, live: _Live) -> None:
        live.trainable = current_values(live.scope, self.trainable, live.trainable)
        live.non_trainable = current_values(live.scope, self.non_trainable, live.non_trainable)
        live.metrics = current_values(live.scope, self.metric_variables, live.metrics)

    def manual_step(self, loss_fn: Callable[[], Any], optimizer: Any, variables: Sequence[Any] | None) -> Any:
        """What `Module.manual_step` does inside `training_step` (see there)."""
        wrapped = wrapped_optimizer(optimizer, self.configured, self.optimizers)
        variables = list(self.module.model.trainable_variables if variables is None else variables)
        if not variables:
            raise ValueError("self.manual_step(...) got no variables to update.")
        number = self._rule_number(wrapped, variables)
        live = self._live
        if live is None:  # the first, abstract trace: it only names the rules
            return check_loss(loss_fn(), "self.manual_step's loss_fn")
        rule = self.rules[number]
        self._read_scope(live)  # what the training_step did so far (a seed generator's draws, earlier updates)
        scale = live.scales[number][0] if rule.loss_scale.scaling else None
        around = self._mapping(live)

        def scaled_loss(values: list) -> tuple[Any, tuple]:
            mapping = around + list(zip(rule.variables, values, strict=True))
            with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
                loss = check_loss(loss_fn(), "self.manual_step's loss_fn")
                non_trainable = current_values(scope, self.non_trainable, live.non_trainable)
                metrics = current_values(scope, self.metric_variables, live.metrics)
            return rule.loss_scale.scale(keras.ops.cast(loss, "float32"), scale), (loss, non_trainable, metrics)

        values = [live.trainable[position] for position in self.positions[number]]
        gradients, (loss, live.non_trainable, live.metrics) = jax.grad(scaled_loss, has_aux=True)(values)
        self._update(live, number, rule.loss_scale.unscale(gradients, scale))
        for variable, value in self._mapping(live):
            live.scope.add_update((variable, value))
        return loss

    def _rule_number(self, optimizer: Any, variables: list) -> int:
        for number, rule in enumerate(self.rules):
            if rule.optimizer is optimizer:
                if len(rule.variables) != len(variables) or any(a is not b for a, b in zip(rule.variables, variables,
                                                                                           strict=False)):
                    raise ValueError(
                        "self.manual_step(...) was given one optimizer for two lists of variables; on the JAX backend "
                        "each optimizer updates one list per step (its stateless update covers every variable it "
                        "was built on). Give each list its own optimizer in configure_optimizers().")
                return number
        if self._live is not None:
            raise ValueError("self.manual_step(...) made an update the first trace of training_step did not make: "
                             "make the same updates at every step.")
        self.rules.append(JaxUpdateRule(optimizer, variables, self.precision, self.clip, self.accumulate))
        return len(self.rules) - 1

    def _update(self, live: _Live, number: int, gradients: list) -> None:
        positions = self.positions[number]
        values = [live.trainable[position] for position in positions]
        values, live.optimizers[number], live.accumulation[number], live.scales[number], due, skipped = \
            self.rules[number].update(gradients, values, live.optimizers[number], live.accumulation[number],
                                      live.scales[number])
        for position, value in zip(positions, values, strict=True):
            live.trainable[position] = value
        live.flags.append((due, skipped))

    # ----- accumulation at epoch ends and in checkpoints -----------------------------------------

    def pending(self) -> int:
        """Batches accumulated in the current partial group (the largest over the rules)."""
        if self.accumulate == 1:
            return 0
        counts = [None] * len(self.rules) if self.big is None else [group[-1] for group in self.big[3]]
        return max(rule.pending(count) for rule, count in zip(self.rules, counts, strict=True))

    def flush(self) -> tuple[bool, bool]:
        """Apply the gradients accumulated so far (at an epoch end), as the TensorFlow engine does.

        Returns:
            (stepped, skipped): whether an optimizer step was taken, and whether one was skipped for
            non-finite gradients.
        """
        if self.pending() == 0:
            return False, False
        big, small = self.read_state()
        self.big, small, skipped = jax.jit(self._flush, donate_argnums=0)(big, small)
        self.write_small(small)
        return True, bool(skipped)

    def _flush(self, big: tuple, small: tuple) -> tuple[tuple, tuple, Any]:
        live = _Live.of(big, small)
        for number, rule in enumerate(self.rules):
            positions = self.positions[number]
            values = [live.trainable[position] for position in positions]
            values, live.optimizers[number], live.accumulation[number], live.scales[number], _, skipped = \
                rule.flush(values, live.optimizers[number], live.accumulation[number], live.scales[number])
            for position, value in zip(positions, values, strict=True):
                live.trainable[position] = value
            live.flags.append((None, skipped))
        return *live.state(), jnp.any(jnp.stack([skipped for _, skipped in live.flags]))

    def state_dict(self) -> dict[str, Any]:
        """The partial accumulation group of each rule (empty without one), as the TensorFlow engine lays it out."""
        return groups_state_dict(self.rules, self.pending())

    def mismatch(self, state: dict[str, Any]) -> str:
        """Why a saved partial group does not fit this step ("" when it does, or there is none)."""
        return groups_mismatch(self.rules, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the partial groups (after `mismatch` found none)."""
        load_groups(self.rules, state)
        self.big = None


def current_values(scope: Any, variables: Sequence[Any], given: Sequence[Any]) -> list[Any]:
    """What a `keras.StatelessScope` holds for each variable after the hooks ran: assigned, or as given."""
    values = [scope.get_current_value(variable) for variable in variables]
    return [old if value is None else value for value, old in zip(values, given, strict=True)]


def _index(variables: Sequence[Any], variable: Any) -> int:
    return next(number for number, known in enumerate(variables) if known is variable)


def _map(function: Callable[[Sequence[Any]], list], groups: tuple) -> tuple:
    """`function` of each list in `groups`, where a group is a list of variables or a list of such lists."""
    return tuple([function(inner) for inner in group] if group and isinstance(group[0], list) else function(group)
                 for group in groups)


def _assign(groups: tuple, values: tuple) -> None:
    for group, group_values in zip(groups, values, strict=True):
        nested = group and isinstance(group[0], list)
        for variables, each in (zip(group, group_values, strict=True) if nested else [(group, group_values)]):
            for variable, value in zip(variables, each, strict=True):
                variable.assign(value)
