"""The training step of one batch, on every replica: loss, gradients, accumulation, loss scaling, clipping, update.

Everything that runs on each replica is unconditional arithmetic; the decisions (apply the
update? skip it?) are taken once, in the cross-replica context reached through `merge_call`,
where the update is run on every replica with `call_for_each_replica`. That is the only place
a `tf.cond` may call the optimizer under MirroredStrategy, and it makes the decision one for
all replicas.

An `UpdateRule` is one optimizer over one list of variables. With automatic optimization the
step has one, over the model's trainable variables, and differentiates the loss `training_step`
returns. With manual optimization (`Module.automatic_optimization = False`) `training_step`
calls `self.manual_step(loss_fn, optimizer, variables)` once per update: each call has a rule of
its own (its own loss scale, accumulation and skip decision), found when the step is first traced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from ktrainer.backends.tensorflow.gradients import (
    dense,
    is_sparse,
    nonzero_rows,
    replica_share,
    sum_duplicate_rows,
    values,
)
from ktrainer.module import LogOptions, module_runtime
from ktrainer.precision.loss_scale import scale_gradient
from ktrainer.step.accumulation import PartialGroup, groups_mismatch, groups_state_dict, load_groups
from ktrainer.step.hooks import NO_UPDATE, call_step_hook, loss_from_return, wrapped_optimizer
from ktrainer.step.outputs import (
    APPLIED,
    BATCH_SIZE,
    CLOCK,
    LOSS_SCALE,
    SKIPPED,
    STOP,
    batch_size_of,
    check_loss,
    scalar_logs,
    with_model_losses,
)

__all__ = ["TrainStep", "UpdateRule"]


def _all_reduce_sum(tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    context = tf.distribute.get_replica_context()
    if not tensors or context is None or context.num_replicas_in_sync == 1:
        return tensors
    return context.all_reduce(tf.distribute.ReduceOp.SUM, tensors)


class UpdateRule(PartialGroup):
    """One optimizer updating one list of variables: loss scaling, accumulation, the skip decision, clipping.

    The loss each replica differentiates is the mean over its own batch divided by the number of
    replicas, so the sum over replicas (what the optimizer applies) is the gradient of the mean
    over the global batch. Gradients of `accumulate` batches are averaged before one update;
    clipping (by global norm) acts on the unscaled, averaged, all-replica gradient.

    A sparse gradient (an Embedding's) reaches the optimizer as the gradient of the loss, still
    sparse: its duplicate rows summed on each replica, summed over replicas here (every replica
    then holds it whole, and the non-finite check and the clipping norm read it), and each replica
    hands the optimizer a share of its rows, so the optimizer's own sum over replicas gives every
    row once (see `gradients.py`).

    Args:
        optimizer: The optimizer, as the precision plugin wrapped it.
        variables: The variables it updates.
        precision: The precision plugin.
        strategy: The tf.distribute strategy.
        clip: The global norm to clip to, or None.
        accumulate: Batches per update.
    """

    def __init__(self, optimizer: Any, variables: Sequence[Any], precision: Any, strategy: tf.distribute.Strategy,
                 clip: float | None, accumulate: int) -> None:
        self.optimizer = optimizer
        self.variables = list(variables)
        self.precision = precision
        self.strategy = strategy
        self.clip = clip
        self.accumulate = accumulate
        self.replicas = strategy.num_replicas_in_sync
        self.sums: list[tf.Variable] = []
        self.count: tf.Variable | None = None
        self._trained: list[bool] = [True] * len(self.variables)
        self._sparse: list[bool] = [False] * len(self.variables)

    def build(self) -> None:
        """Create the accumulation variables, one copy per replica (call inside the strategy scope)."""
        if self.accumulate > 1:
            local = {"trainable": False, "synchronization": tf.VariableSynchronization.ON_READ}
            self.sums = [tf.Variable(tf.zeros_like(v), aggregation=tf.VariableAggregation.SUM, **local)
                         for v in self.variables]
            self.count = tf.Variable(0, dtype=tf.int64, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                                     **local)

    def pending(self) -> int:
        """Batches accumulated in the current partial group (read on this worker only)."""
        return 0 if self.count is None else int(self.count.numpy())

    def differentiate(self, loss_fn: Callable[[], tf.Tensor], checked: str) -> tuple[tf.Tensor, list]:
        """(loss, unscaled gradients of the variables that get one) of `loss_fn`'s per-replica mean loss."""
        with tf.GradientTape() as tape:
            loss = check_loss(loss_fn(), checked)
            share = loss / tf.cast(self.replicas, loss.dtype)
            scaled = self.precision.scale_loss(share, self.optimizer)
        gradients = tape.gradient(scaled, self.variables)
        self._trained = [g is not None for g in gradients]
        if not any(self._trained):
            raise ValueError(
                f"No gradient reaches any variable that {checked} updates: its loss does not depend on them. "
                "Compute the loss from self.model(...) (or, in manual optimization, from the variables given to "
                "self.manual_step)."
            )
        present = [sum_duplicate_rows(gradient) for gradient in self._present(gradients)]
        return loss, self.precision.unscale_gradients(present, self.optimizer)

    def update(self, gradients: list) -> tuple[tf.Tensor, tf.Tensor]:
        """Accumulate, then (at a group's end) apply or skip, one decision for all replicas; (applied, skipped)."""
        if self.accumulate == 1:
            return self._decide(gradients, tf.constant(True))
        sums = self._present(self.sums)
        for total, gradient in zip(sums, gradients, strict=True):
            if is_sparse(gradient) and self.replicas == 1:
                total.scatter_add(gradient)  # only the rows the batch touched
            else:  # a replica's own sum (sync-on-read) has no scatter: add the rows as a dense tensor
                total.assign_add(dense(gradient))
        self.count.assign_add(1)
        self._sparse = [is_sparse(gradient) for gradient in gradients]
        due = self.count >= self.accumulate
        mean = self._group_mean(sums, self.accumulate)
        self._reset_where(due)
        return self._decide(mean, due)

    def flush_on_replica(self) -> tf.Tensor:
        """Apply the partial group accumulated so far (per replica, inside `strategy.run`); the skipped flag."""
        mean = self._group_mean(self._present(self.sums), self.count)
        self._reset_where(tf.constant(True))
        return self._decide(mean, tf.constant(True))[1]

    def _group_mean(self, sums: list[tf.Variable], batches: Any) -> list:
        """The mean gradient of a group's batches; a sparse gradient's as the rows its batches touched (sparse)."""
        mean = [total / tf.cast(batches, total.dtype) for total in sums]
        return [nonzero_rows(m) if sparse else m for m, sparse in zip(mean, self._sparse, strict=True)]

    def loss_scale(self) -> Any:
        """The current loss scale, or None."""
        return self.precision.loss_scale(self.optimizer)

    def _present(self, items: list) -> list:
        return [item for item, trained in zip(items, self._trained, strict=True) if trained]

    def _reset_where(self, due: tf.Tensor) -> None:
        for total in self.sums:
            total.assign(tf.where(due, tf.zeros_like(total), total))
        self.count.assign(tf.where(due, tf.zeros_like(self.count), self.count))

    def _decide(self, local_gradients: list, due: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        gradients = self._sparse_summed_over_replicas(local_gradients)
        if self.accumulate == 1 and not self.precision.loss_scaling:
            self._apply_on_replica(gradients)  # nothing to decide: the plain, fastest path
            return tf.constant(1.0), tf.constant(0.0)
        bad = [tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(values(g))), tf.float32)) for g in gradients]
        finite = tf.equal(_all_reduce_sum([tf.add_n(bad)])[0], 0.0)
        context = tf.distribute.get_replica_context()
        skipped = context.merge_call(self._update_all_replicas, args=(gradients, due, finite))
        return tf.cast(due, tf.float32), skipped

    def _sparse_summed_over_replicas(self, local_gradients: list) -> list:
        """Each sparse gradient summed over replicas, one row per index (every replica holds it whole); each dense
        gradient this replica's own (the optimizer sums those)."""
        sparse = [index for index, gradient in enumerate(local_gradients) if is_sparse(gradient)]
        if self.replicas == 1 or not sparse:
            return local_gradients
        summed = _all_reduce_sum([local_gradients[index] for index in sparse])
        gradients = list(local_gradients)
        for index, gradient in zip(sparse, summed, strict=True):
            gradients[index] = sum_duplicate_rows(gradient)
        return gradients

    def _update_all_replicas(self, strategy: tf.distribute.Strategy, local_gradients: Any, due: Any,
                             finite: Any) -> tf.Tensor:
        due = strategy.experimental_local_results(due)[0]
        finite = strategy.experimental_local_results(finite)[0]

        def apply():
            strategy.extended.call_for_each_replica(self._apply_on_replica, args=(local_gradients,))

        return tf.cond(due, lambda: self.precision.apply(self.optimizer, apply, finite), lambda: tf.constant(0.0))

    def _apply_on_replica(self, gradients: list) -> None:
        """Clip, then hand the optimizer this replica's gradients (a share of each sparse one's rows); it sums them
        over replicas."""
        if self.clip is not None:
            sparse = [g.values for g in gradients if is_sparse(g)]  # already the sum over replicas
            dense_sums = _all_reduce_sum([g for g in gradients if not is_sparse(g)])
            norm = tf.linalg.global_norm(dense_sums + sparse)  # the norm of the sum
            factor = tf.minimum(1.0, self.clip / tf.maximum(norm, 1e-12))
            gradients = [scale_gradient(g, factor) for g in gradients]
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        shares = [replica_share(g, replica, self.replicas) for g in gradients]
        optimizer = self.precision.optimizer_to_step(self.optimizer)
        optimizer.apply(shares, self._present(self.variables))


class TrainStep:
    """One training step on one (per-replica) batch, with automatic or manual optimization.

    Args:
        module: The user's Module (its `model` already built).
        optimizers: The optimizers (as wrapped by the precision plugin), in `configure_optimizers` order.
        configured: The user's own optimizer objects, in the same order (what `manual_step` is given).
        precision: The precision plugin.
        strategy: The tf.distribute strategy.
        gradient_clip_val: Clip the global gradient norm to this value; None: no clipping.
        accumulate_grad_batches: Batches per optimizer update.
        stop_flag: A variable local to this worker, > 0 once it wants to stop (a preemption
            signal); when given, every step returns its sum over all workers as `_stop`, so all
            workers decide to stop after the same step. None in single-process runs.
        clock: With `stop_flag`, a variable local to this worker: the chief's seconds since the fit started
            (set before each execution), 0 on the other workers; every step returns the value of the
            workers' first replica (the chief's) as `_clock`, the run's one clock (run_clock.py).
    """

    def __init__(self, module: Any, optimizers: Sequence[Any], configured: Sequence[Any], precision: Any,
                 strategy: tf.distribute.Strategy, *, gradient_clip_val: float | None, accumulate_grad_batches: int,
                 stop_flag: tf.Variable | None = None, clock: tf.Variable | None = None) -> None:
        self.module = module
        self.optimizers = list(optimizers)
        self.configured = list(configured)
        self.precision = precision
        self.strategy = strategy
        self.clip = gradient_clip_val
        self.accumulate = accumulate_grad_batches
        self.stop_flag = stop_flag
        self.clock = clock
        self.automatic = getattr(module, "automatic_optimization", True)
        self.rules: list[UpdateRule] = []
        self._rule_of: dict[tuple, UpdateRule] = {}
        self._replica = threading.local()  # MirroredStrategy runs each replica's step in a thread of its own
        self._flush_function = tf.function(self._flush_on_replicas)

    # ----- set-up -----------------------------------------------------------------------------

    def build(self) -> None:
        """Create the update rules' state and build each optimizer on its variables (inside the strategy scope;
        after `forward` was traced once, which shows a manual step's rules)."""
        if self.automatic:
            self.rules = [self._rule(self.optimizers[0], self.module.model.trainable_variables)]
        by_optimizer: dict[int, list] = {}
        for rule in self.rules:
            rule.build()
            known = by_optimizer.setdefault(id(rule.optimizer), [])
            known.extend(v for v in rule.variables if all(v is not k for k in known))
        for optimizer in self.optimizers:
            if id(optimizer) in by_optimizer:
                optimizer.build(by_optimizer[id(optimizer)])

    def _rule(self, optimizer: Any, variables: Sequence[Any]) -> UpdateRule:
        key = (id(optimizer), tuple(id(v) for v in variables))
        if key not in self._rule_of:
            rule = UpdateRule(optimizer, variables, self.precision, self.strategy, self.clip, self.accumulate)
            self._rule_of[key] = rule
            if not self.automatic:
                self.rules.append(rule)
        return self._rule_of[key]

    # ----- the step ---------------------------------------------------------------------------

    def forward(self, batch: Any) -> dict[str, tf.Tensor]:
        """Loss and logs of a batch, without gradients (used to discover the output keys, and a manual step's
        rules)."""
        self._replica.discovering = True
        try:
            logs = self._run_training_step(batch, lambda loss_fn, checked: check_loss(loss_fn(), checked))
        finally:
            self._replica.discovering = False
        flag = tf.constant(0.0)
        stop = {STOP: flag, CLOCK: flag} if self.stop_flag is not None else {}
        return {**logs, **self._precision_logs(), BATCH_SIZE: batch_size_of(batch), APPLIED: flag, SKIPPED: flag,
                **stop}

    def __call__(self, batch: Any) -> dict[str, tf.Tensor]:
        """One training step on one (per-replica) batch."""
        flags = self._replica.flags = []
        if self.automatic:
            rule = self.rules[0]

            def update(loss_fn: Callable[[], Any], checked: str) -> tf.Tensor:
                loss, gradients = rule.differentiate(loss_fn, checked)
                flags.append(rule.update(gradients))
                return loss

            logs = self._run_training_step(batch, update)
        else:
            logs = self._run_training_step(batch, None)
        if not flags:
            raise ValueError(NO_UPDATE)
        applied = tf.reduce_max(tf.stack([a for a, _ in flags]))
        skipped = tf.reduce_max(tf.stack([s for _, s in flags]))
        stop = self._agreed_values() if self.stop_flag is not None else {}
        return {**logs, **self._precision_logs(), BATCH_SIZE: batch_size_of(batch), APPLIED: applied,
                SKIPPED: skipped, **stop}

    def manual_step(self, loss_fn: Callable[[], Any], optimizer: Any, variables: Sequence[Any] | None) -> tf.Tensor:
        """What `Module.manual_step` does inside `training_step` (see there)."""
        wrapped = wrapped_optimizer(optimizer, self.configured, self.optimizers)
        variables = list(self.module.model.trainable_variables if variables is None else variables)
        if not variables:
            raise ValueError("self.manual_step(...) got no variables to update.")
        rule = self._rule(wrapped, variables)
        if getattr(self._replica, "discovering", False):
            return check_loss(loss_fn(), "self.manual_step's loss_fn")
        loss, gradients = rule.differentiate(loss_fn, "self.manual_step's loss_fn")
        self._replica.flags.append(rule.update(gradients))
        return loss

    def _call_training_step(self, batch: Any) -> Any:
        return loss_from_return(self.module, call_step_hook(self.module, "training_step", batch), "training_step",
                                "train")

    def _run_training_step(self, batch: Any, automatic_update: Callable | None) -> dict[str, tf.Tensor]:
        module = self.module
        runtime = module_runtime(module)
        with runtime.step_hook("train", manual=self):
            if automatic_update is not None and self.automatic:
                def loss_fn() -> Any:
                    return with_model_losses(module, check_loss(self._call_training_step(batch), "training_step"),
                                             "train")
                loss = automatic_update(loss_fn, "training_step")
            else:
                returned = self._call_training_step(batch)
                loss = None if returned is None else check_loss(returned, "training_step")
        if loss is not None:
            module.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return scalar_logs(runtime.take_logged(), "training_step")

    def _agreed_values(self) -> dict[str, tf.Tensor]:
        """The stop vote (> 0 when any worker wants to stop) and the chief's clock, the same on every worker."""
        # The variables live outside the strategy, one per worker: read them here, on this replica's device.
        stop, clock = (tf.identity(tf.cast(variable.read_value(), tf.float32)) for variable in (self.stop_flag,
                                                                                                  self.clock))
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return {STOP: stop, CLOCK: clock}
        # Strategies reduce by SUM or MEAN only: the clock counts once, from the first replica (the chief's).
        first = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
        stop, clock = context.all_reduce(tf.distribute.ReduceOp.SUM, [stop, clock * first])
        return {STOP: stop, CLOCK: clock}

    def _precision_logs(self) -> dict[str, tf.Tensor]:
        rules = self.rules or [UpdateRule(self.optimizers[0], [], self.precision, self.strategy, None, 1)]
        scale_ = rules[0].loss_scale()
        if scale_ is None:
            return {}
        module_runtime(self.module).log_options[LOSS_SCALE] = LogOptions(on_step=True, on_epoch=False, prog_bar=True)
        return {LOSS_SCALE: tf.cast(tf.convert_to_tensor(scale_), tf.float32)}

    # ----- epoch ends and checkpoints ---------------------------------------------------------

    def pending(self) -> int:
        """Batches accumulated in a partial group (the largest over the rules; read on this worker)."""
        return max((rule.pending() for rule in self.rules), default=0)

    def flush(self) -> tuple[bool, bool]:
        """Apply the gradients accumulated so far (at an epoch end).

        Returns:
            (stepped, skipped): whether an optimizer step was taken, and whether one was skipped
            for non-finite gradients.
        """
        if self.accumulate == 1 or self.pending() == 0:
            return False, False
        skipped = self._flush_function()
        return True, bool(self.strategy.experimental_local_results(skipped)[0].numpy())

    def _flush_on_replicas(self) -> Any:
        def flush():
            return tf.reduce_max(tf.stack([rule.flush_on_replica() for rule in self.rules]))

        return self.strategy.run(flush)

    def state_dict(self) -> dict[str, Any]:
        """The gradients accumulated so far in a partial group, per rule (empty without one).

        Under several replicas each keeps its own sums; reading gives their total and loading
        splits it evenly, which the all-replica sum of the update does not notice. Across workers
        that total would need every worker, so multi-worker runs save at group boundaries only.
        """
        pending = self.pending()  # the count is read locally, no collective
        if pending and self.stop_flag is not None:
            raise RuntimeError("A checkpoint of a partial accumulation group in a multi-worker run would need every "
                               "worker's sums; the Trainer ends its executions at group boundaries there, so this "
                               "is a bug: please report it.")
        return groups_state_dict(self.rules, pending)

    def mismatch(self, state: dict[str, Any]) -> str:
        """Why a saved partial group does not fit this step ("" when it does, or there is none)."""
        return groups_mismatch(self.rules, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the partial groups (after `mismatch` found none)."""
        load_groups(self.rules, state)
