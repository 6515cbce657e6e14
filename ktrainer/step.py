"""Running compiled steps: N batches per call, per-replica outputs reduced exactly; evaluation and prediction.

The training step itself is in train_step.py.

Every step function returns a flat dict of scalars: the loss and what the module logged,
plus `_batch_size` (examples in the batch) and, for training, `_applied` (1.0 when the
batch completed an optimizer step) and `_skipped` (1.0 when that step was skipped for
non-finite gradients), and in multi-worker runs `_stop` (> 0 when any worker received a
preemption signal, the same on all). `CompiledSteps` runs up to `steps_per_execution` of them in one
`tf.function` call and returns each step's values, so logging stays per step while the
Python overhead is paid once per execution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from ktrainer.compat.keras_internals import with_unscaled_losses
from ktrainer.hooks import call_step_hook, loss_from_return, traced_batch_index

__all__ = ["CompiledSteps", "EvalStep", "compile_predict_step", "BATCH_SIZE", "APPLIED", "SKIPPED",
           "LOSS_SCALE", "STOP"]

BATCH_SIZE = "_batch_size"
APPLIED = "_applied"
SKIPPED = "_skipped"
LOSS_SCALE = "precision/loss_scale"
STOP = "_stop"
_SAME_ON_EVERY_REPLICA = (APPLIED, SKIPPED, LOSS_SCALE, STOP)


class CompiledSteps:
    """Runs a per-batch step function up to N times inside one compiled call.

    Args:
        step_fn: Per-replica function of one batch returning a flat dict of scalars.
        strategy: The tf.distribute strategy the step runs under.
        output_keys: The keys `step_fn` returns (found by `discover_outputs`).
        jit_compile: Compile the function with XLA.
    """

    def __init__(
        self,
        step_fn: Callable[[Any], dict],
        strategy: tf.distribute.Strategy,
        output_keys: list[str],
        *,
        jit_compile: bool = False,
    ) -> None:
        self._step_fn = with_unscaled_losses(step_fn)
        self._strategy = strategy
        self._keys = list(output_keys)
        self._function = tf.function(self._run_steps, jit_compile=jit_compile)
        self._concrete = None
        self._step_counts: dict[int, tf.Tensor] = {}

    def run(self, iterator: Any, num_steps: int, first_index: int = 0) -> dict[str, np.ndarray]:
        """Run up to `num_steps` batches from `iterator`; stops early when it is exhausted.

        Args:
            iterator: The distributed iterator of batches.
            num_steps: Batches to run at most.
            first_index: The first batch's index in its epoch (the hooks' `batch_idx`).

        Returns:
            Each key's per-step values (empty arrays when the iterator was already exhausted).
        """
        if num_steps not in self._step_counts:
            self._step_counts[num_steps] = tf.constant(num_steps, tf.int32)
        count, start = self._step_counts[num_steps], tf.constant(first_index, tf.int64)
        # Calling the traced graph directly skips tf.function's per-call signature matching,
        # which costs more than a small model's step.
        if self._concrete is None:
            self._concrete = self._function.get_concrete_function(iterator, count, start)
        values = self._concrete(iterator, count, start).numpy()
        return dict(zip(self._keys, values, strict=True))

    def _run_steps(self, iterator: Any, num_steps: tf.Tensor, first_index: tf.Tensor) -> tf.Tensor:
        values = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=(len(self._keys),))
        for index in tf.range(num_steps):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            with traced_batch_index(first_index + tf.cast(index, tf.int64)):
                outputs = self._replicated_step(optional.get_value())
            values = values.write(index, tf.stack([outputs[key] for key in self._keys]))
        return tf.transpose(values.stack())

    def _replicated_step(self, batch: Any) -> dict[str, tf.Tensor]:
        if self._strategy.num_replicas_in_sync == 1:
            outputs = self._strategy.run(self._step_fn, args=(batch,))
            return {key: self._strategy.experimental_local_results(outputs[key])[0] for key in self._keys}
        per_replica = self._strategy.run(self._weighted_step, args=(batch,))
        examples = self._strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica[BATCH_SIZE], axis=None)
        reduced = {BATCH_SIZE: examples}
        for key in self._keys:
            if key in _SAME_ON_EVERY_REPLICA:
                reduced[key] = self._strategy.experimental_local_results(per_replica[key])[0]
            elif key != BATCH_SIZE:
                total = self._strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica[key], axis=None)
                reduced[key] = total / tf.maximum(examples, 1.0)
        return reduced

    def _weighted_step(self, batch: Any) -> dict[str, tf.Tensor]:
        """The step's values times the replica's batch size, so the sum over replicas gives exact means.

        A replica may get fewer examples, or none, from the last batch of an evaluation set.
        """
        outputs = self._step_fn(batch)
        size = outputs[BATCH_SIZE]
        return {key: value if key in _SAME_ON_EVERY_REPLICA or key == BATCH_SIZE else
                tf.where(size > 0, value * size, 0.0) for key, value in outputs.items()}


def discover_outputs(step_fn: Callable[[Any], dict], element_spec: Any) -> list[str]:
    """Trace `step_fn` once on the data's element spec and return its output keys.

    Tracing builds the model's variables (a subclassed model may not be built yet) and runs
    the checks on the loss and logged values, before anything is trained or written.
    """
    concrete = tf.function(with_unscaled_losses(step_fn)).get_concrete_function(element_spec)
    return list(concrete.structured_outputs)


def batch_size_of(batch: Any) -> tf.Tensor:
    """Number of examples in a batch: the leading dimension of its first tensor."""
    return tf.cast(tf.shape(tf.nest.flatten(batch)[0])[0], tf.float32)


def scalar_logs(logged: dict[str, Any], hook: str) -> dict[str, tf.Tensor]:
    """Check that every value logged by `hook` is a scalar and cast it to float32.

    Raises:
        ValueError: Naming the value and its shape.
    """
    out = {}
    for name, value in logged.items():
        tensor = tf.convert_to_tensor(value)
        if tensor.shape.rank != 0:
            raise ValueError(
                f"self.log({name!r}, ...) in {hook} got a value of shape {tensor.shape}; logged "
                "values must be scalars. Reduce it first, e.g. keras.ops.mean(value)."
            )
        out[name] = tf.cast(tensor, tf.float32)
    return out


def check_loss(loss: Any, hook: str) -> tf.Tensor:
    """Return `loss` as a tensor if it is a scalar float.

    Raises:
        ValueError: With the shape or dtype found.
    """
    if loss is None:
        raise ValueError(f"{hook} returned None; it must return the scalar float loss of the batch.")
    tensor = tf.convert_to_tensor(loss)
    if tensor.shape.rank != 0:
        raise ValueError(
            f"{hook} returned a loss of shape {tensor.shape}; it must be a scalar. Reduce it, "
            "e.g. keras.ops.mean(per_example_loss)."
        )
    if not tensor.dtype.is_floating:
        raise ValueError(
            f"{hook} returned a loss of dtype {tensor.dtype.name}; it must be a float. "
            "Cast it, e.g. keras.ops.cast(loss, 'float32')."
        )
    return tensor


def with_model_losses(module: Any, loss: tf.Tensor, prefix: str) -> tf.Tensor:
    """`loss` plus the model's own losses (kernel and activity regularizers, `add_loss` terms), as Keras's `fit`
    and `evaluate` add them; their sum, in float32, is logged as `{prefix}/reg_loss`.

    Nothing is added when the model has none or `module.add_model_losses` is False.
    """
    model = module.model
    if not module.add_model_losses or model is None or not model.losses:
        return loss
    terms = [tf.reduce_sum(tf.cast(term, tf.float32)) for term in model.losses]
    total = tf.add_n(terms)
    both = prefix == "train"
    module.log(f"{prefix}/reg_loss", total, on_step=both or None, on_epoch=both or None)
    return loss + tf.cast(total, loss.dtype)


class EvalStep:
    """The evaluation step of one batch: `validation_step` or `test_step`, no gradients.

    Args:
        module: The user's Module.
        hook: "validation_step" or "test_step".
        prefix: "val" or "test"; a scalar returned by the hook is logged as `{prefix}/loss`.
    """

    def __init__(self, module: Any, hook: str, prefix: str) -> None:
        self.module = module
        self.hook = hook
        self.prefix = prefix

    def __call__(self, batch: Any) -> dict[str, tf.Tensor]:
        """One evaluation step on one (per-replica) batch."""
        self.module._stage = self.prefix
        self.module._take_logged()
        returned = loss_from_return(self.module, call_step_hook(self.module, self.hook, batch), self.hook, self.prefix)
        if returned is not None:
            loss = with_model_losses(self.module, check_loss(returned, self.hook), self.prefix)
            self.module.log(f"{self.prefix}/loss", loss)
        logs = scalar_logs(self.module._take_logged(), self.hook)
        return {**logs, BATCH_SIZE: batch_size_of(batch)}


def compile_predict_step(module: Any, strategy: tf.distribute.Strategy) -> Callable[[Any], Any]:
    """A compiled function of one batch and its index that runs `module.predict_step` on every replica."""

    def predict(batch, batch_idx):
        module._stage = "predict"
        with traced_batch_index(batch_idx):
            outputs = strategy.run(with_unscaled_losses(lambda each: call_step_hook(module, "predict_step", each)),
                                   args=(batch,))
        return tf.nest.map_structure(lambda t: strategy.gather(t, axis=0), outputs)

    return tf.function(predict, reduce_retracing=True)
