"""The training step of one batch, on every replica: loss, gradients, accumulation, loss scaling, clipping, update.

Everything that runs on each replica is unconditional arithmetic; the decisions (apply the
update? skip it?) are taken once, in the cross-replica context reached through `merge_call`,
where the update is run on every replica with `call_for_each_replica`. That is the only place
a `tf.cond` may call the optimizer under MirroredStrategy, and it makes the decision one for
all replicas.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ktrainer.gradients import dense, scale, values
from ktrainer.module import LogOptions
from ktrainer.step import (
    APPLIED,
    BATCH_SIZE,
    LOSS_SCALE,
    SKIPPED,
    STOP,
    batch_size_of,
    check_loss,
    scalar_logs,
    with_model_losses,
)

__all__ = ["TrainStep"]


def _all_reduce_sum(values: list[tf.Tensor]) -> list[tf.Tensor]:
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return values
    return context.all_reduce(tf.distribute.ReduceOp.SUM, values)


class TrainStep:
    """One training step on one (per-replica) batch.

    The loss each replica returns is the mean over its own batch; its gradient is divided by
    the number of replicas, so the sum over replicas (what the optimizer applies) is the gradient
    of the mean loss over the global batch. Gradients of `accumulate_grad_batches` batches are
    averaged before one update; clipping (by global norm) acts on the unscaled, averaged,
    all-replica gradient.

    Args:
        module: The user's Module (its `model` already built).
        optimizer: The optimizer (as wrapped by the precision plugin), built on the model's variables.
        precision: The precision plugin.
        strategy: The tf.distribute strategy.
        gradient_clip_val: Clip the global gradient norm to this value; None: no clipping.
        accumulate_grad_batches: Batches per optimizer update.
        stop_flag: A variable local to this worker, > 0 once it wants to stop (a preemption
            signal); when given, every step returns its sum over all workers as `_stop`, so all
            workers decide to stop after the same step. None in single-process runs.
    """

    def __init__(self, module: Any, optimizer: Any, precision: Any, strategy: tf.distribute.Strategy, *,
                 gradient_clip_val: float | None, accumulate_grad_batches: int,
                 stop_flag: tf.Variable | None = None) -> None:
        self.module = module
        self.optimizer = optimizer
        self.precision = precision
        self.strategy = strategy
        self.clip = gradient_clip_val
        self.accumulate = accumulate_grad_batches
        self.replicas = strategy.num_replicas_in_sync
        self.stop_flag = stop_flag
        self._sums: list[tf.Variable] = []
        self._count: tf.Variable | None = None
        self._trained: list[bool] = []
        self._flush_function = tf.function(self._flush_on_replicas)

    def build(self) -> None:
        """Create the accumulation variables, one copy per replica (call inside the strategy scope)."""
        if self.accumulate > 1:
            local = {"trainable": False, "synchronization": tf.VariableSynchronization.ON_READ}
            self._sums = [tf.Variable(tf.zeros_like(v), aggregation=tf.VariableAggregation.SUM, **local)
                          for v in self.module.model.trainable_variables]
            self._count = tf.Variable(0, dtype=tf.int64, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                                      **local)

    def state_dict(self) -> dict[str, Any]:
        """The gradients accumulated so far in a partial group (empty without one).

        Under several replicas each keeps its own sums; reading gives their total and loading
        splits it evenly, which the all-replica sum of the update does not notice. Across workers
        that total would need every worker, so multi-worker runs save at group boundaries only.
        """
        if self.accumulate == 1 or int(self._count.numpy()) == 0:  # the count is read locally, no collective
            return {}
        if self.stop_flag is not None:
            raise RuntimeError("A checkpoint of a partial accumulation group in a multi-worker run would need every "
                               "worker's sums; the Trainer ends its executions at group boundaries there, so this "
                               "is a bug: please report it.")
        return {"count": self._count, "sums": {f"{i:05d}": total for i, total in enumerate(self._sums)}}

    def mismatch(self, state: dict[str, Any]) -> str:
        """Why a saved partial group does not fit this step ("" when it does, or there is none)."""
        if not state:
            return ""
        sums = list(state["sums"].values())
        if self.accumulate == 1 or len(sums) != len(self._sums) or int(state["count"]) >= self.accumulate:
            return (f"The checkpoint holds a partial gradient-accumulation group of {int(state['count'])} batches "
                    f"over {len(sums)} variables; this run accumulates {self.accumulate} batches over "
                    f"{len(self._sums)} variables. Resume with the same accumulate_grad_batches (and model).")
        return ""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a partial group's accumulated gradients (after `mismatch` found none)."""
        if not state:
            return
        sums = list(state["sums"].values())
        for total, value in zip(self._sums, sums, strict=True):
            total.assign(value)
        self._count.assign(int(state["count"]))

    def forward(self, batch: Any) -> dict[str, tf.Tensor]:
        """Loss and logs of a batch, without gradients (used to discover the output keys)."""
        _, logs = self._loss_and_logs(batch)
        flag = tf.constant(0.0)
        stop = {STOP: flag} if self.stop_flag is not None else {}
        return {**logs, **self._precision_logs(), BATCH_SIZE: batch_size_of(batch), APPLIED: flag, SKIPPED: flag,
                **stop}

    def __call__(self, batch: Any) -> dict[str, tf.Tensor]:
        """One training step on one (per-replica) batch."""
        variables = self.module.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, logs = self._loss_and_logs(batch)
            share = loss / tf.cast(self.replicas, loss.dtype)
            scaled = self.precision.scale_loss(share, self.optimizer)
        gradients = tape.gradient(scaled, variables)
        self._learn_which_variables_train(gradients)
        gradients = self.precision.unscale_gradients(self._present(gradients), self.optimizer)
        if self.accumulate == 1:
            applied, skipped = self._decide(gradients, tf.constant(True))
        else:
            sums = self._present(self._sums)
            for total, gradient in zip(sums, gradients, strict=True):
                if isinstance(gradient, tf.IndexedSlices):
                    total.scatter_add(gradient)  # only the rows the batch touched
                else:
                    total.assign_add(gradient)
            self._count.assign_add(1)
            due = self._count >= self.accumulate
            mean = [total / tf.cast(self.accumulate, total.dtype) for total in sums]
            self._reset_where(due)
            applied, skipped = self._decide(mean, due)
        stop = {STOP: self._any_worker_stops()} if self.stop_flag is not None else {}
        return {**logs, **self._precision_logs(), BATCH_SIZE: batch_size_of(batch), APPLIED: applied,
                SKIPPED: skipped, **stop}

    def _any_worker_stops(self) -> tf.Tensor:
        # The flag lives outside the strategy, one per worker: read it here, on this replica's device.
        local = tf.identity(tf.cast(self.stop_flag.read_value(), tf.float32))
        return _all_reduce_sum([local])[0]

    def flush(self) -> tuple[bool, bool]:
        """Apply the gradients accumulated so far (at an epoch end).

        Returns:
            (stepped, skipped): whether an optimizer step was taken, and whether it was skipped
            for non-finite gradients.
        """
        if self.accumulate == 1 or int(self._count.numpy()) == 0:
            return False, False
        skipped = self._flush_function()
        return True, bool(self.strategy.experimental_local_results(skipped)[0].numpy())

    def _flush_on_replicas(self) -> Any:
        def flush():
            mean = [total / tf.cast(self._count, total.dtype) for total in self._present(self._sums)]
            self._reset_where(tf.constant(True))
            return self._decide(mean, tf.constant(True))[1]

        return self.strategy.run(flush)

    def _loss_and_logs(self, batch: Any) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        self.module._stage = "train"
        self.module._take_logged()
        loss = with_model_losses(self.module, check_loss(self.module.training_step(batch), "training_step"), "train")
        self.module.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss, scalar_logs(self.module._take_logged(), "training_step")

    def _precision_logs(self) -> dict[str, tf.Tensor]:
        scale = self.precision.loss_scale(self.optimizer)
        if scale is None:
            return {}
        self.module._log_options[LOSS_SCALE] = LogOptions(on_step=True, on_epoch=False, prog_bar=True)
        return {LOSS_SCALE: tf.cast(tf.convert_to_tensor(scale), tf.float32)}

    def _learn_which_variables_train(self, gradients: list) -> None:
        """Remember (at trace time) which variables get a gradient; like Keras, the others are left alone."""
        self._trained = [g is not None for g in gradients]
        if not any(self._trained):
            raise ValueError(
                "No gradient reaches any trainable variable: the loss returned by training_step does not depend "
                "on self.model's weights. Compute the loss from self.model(...)."
            )

    def _present(self, values: list) -> list:
        return [v for v, trained in zip(values, self._trained, strict=True) if trained]

    def _reset_where(self, due: tf.Tensor) -> None:
        for total in self._sums:
            total.assign(tf.where(due, tf.zeros_like(total), total))
        self._count.assign(tf.where(due, tf.zeros_like(self._count), self._count))

    def _decide(self, local_gradients: list, due: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Take the update decision once for all replicas; returns (applied, skipped) flags."""
        if self.accumulate == 1 and not self.precision.loss_scaling:
            self._apply_on_replica(local_gradients)  # nothing to decide: the plain, fastest path
            return tf.constant(1.0), tf.constant(0.0)
        finite = self._all_finite(local_gradients)
        context = tf.distribute.get_replica_context()
        skipped = context.merge_call(self._update_all_replicas, args=(local_gradients, due, finite))
        return tf.cast(due, tf.float32), skipped

    def _all_finite(self, local_gradients: list) -> tf.Tensor:
        bad = [tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(values(g))), tf.float32))
               for g in local_gradients]
        return tf.equal(_all_reduce_sum([tf.add_n(bad)])[0], 0.0)

    def _update_all_replicas(self, strategy: tf.distribute.Strategy, local_gradients: Any, due: Any,
                             finite: Any) -> tf.Tensor:
        due = strategy.experimental_local_results(due)[0]
        finite = strategy.experimental_local_results(finite)[0]

        def apply():
            strategy.extended.call_for_each_replica(self._apply_on_replica, args=(local_gradients,))

        return tf.cond(due, lambda: self.precision.apply(self.optimizer, apply, finite), lambda: tf.constant(0.0))

    def _apply_on_replica(self, local_gradients: list) -> None:
        if self.clip is not None:
            total = _all_reduce_sum([dense(g) for g in local_gradients])  # the norm of the sum
            norm = tf.linalg.global_norm(total)
            factor = tf.minimum(1.0, self.clip / tf.maximum(norm, 1e-12))
            local_gradients = [scale(g, factor) for g in local_gradients]
        optimizer = self.precision.optimizer_to_step(self.optimizer)
        optimizer.apply(local_gradients, self._present(self.module.model.trainable_variables))
