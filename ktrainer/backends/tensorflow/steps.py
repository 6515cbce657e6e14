"""TensorFlow: compiled steps, N batches per call, per-replica outputs reduced exactly; prediction.

The training step itself is in train_step.py; what a step returns is in `ktrainer.step.outputs`.
`CompiledSteps` runs up to `steps_per_execution` of them in one
`tf.function` call and returns each step's values, so logging stays per step while the
Python overhead is paid once per execution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from ktrainer.backends.engine import InFlight, Runner
from ktrainer.compat.keras_internals import with_unscaled_losses
from ktrainer.module import module_runtime
from ktrainer.step.hooks import call_step_hook, traced_batch_index
from ktrainer.step.outputs import BATCH_SIZE, SAME_ON_EVERY_REPLICA

__all__ = ["CompiledSteps", "compile_predict_step", "discover_outputs"]


class CompiledSteps(Runner):
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

    def run(self, iterator: Any, num_steps: int, first_index: int = 0, *, ahead: int = 0) -> dict[str, np.ndarray]:
        """Run up to `num_steps` batches from `iterator`; stops early when it is exhausted.

        Args:
            iterator: The distributed iterator of batches.
            num_steps: Batches to run at most.
            first_index: The first batch's index in its epoch (the hooks' `batch_idx`).
            ahead: Unused: tf.data reads ahead by itself (its `prefetch`).

        Returns:
            Each key's per-step values (empty arrays when the iterator was already exhausted).
        """
        return self.dispatch(iterator, num_steps, first_index, ahead=ahead).result()

    def dispatch(self, iterator: Any, num_steps: int, first_index: int = 0, *, ahead: int = 0) -> InFlight:
        """Call the compiled function and return before its outputs are copied to numpy (what `run` returns)."""
        if num_steps not in self._step_counts:
            self._step_counts[num_steps] = tf.constant(num_steps, tf.int32)
        count, start = self._step_counts[num_steps], tf.constant(first_index, tf.int64)
        # Calling the traced graph directly skips tf.function's per-call signature matching,
        # which costs more than a small model's step.
        if self._concrete is None:
            self._concrete = self._function.get_concrete_function(iterator, count, start)
        values = self._concrete(iterator, count, start)
        return InFlight(lambda: dict(zip(self._keys, values.numpy(), strict=True)))

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
            if key in SAME_ON_EVERY_REPLICA:
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
        return {key: value if key in SAME_ON_EVERY_REPLICA or key == BATCH_SIZE else
                tf.where(size > 0, value * size, 0.0) for key, value in outputs.items()}


def discover_outputs(step_fn: Callable[[Any], dict], element_spec: Any) -> list[str]:
    """Trace `step_fn` once on the data's element spec and return its output keys.

    Tracing builds the model's variables (a subclassed model may not be built yet) and runs
    the checks on the loss and logged values, before anything is trained or written.
    """
    concrete = tf.function(with_unscaled_losses(step_fn)).get_concrete_function(element_spec)
    return list(concrete.structured_outputs)


def compile_predict_step(module: Any, strategy: tf.distribute.Strategy) -> Callable[[Any], Any]:
    """A compiled function of one batch and its index that runs `module.predict_step` on every replica."""

    def predict(batch, batch_idx):
        module_runtime(module).stage = "predict"
        with traced_batch_index(batch_idx):
            outputs = strategy.run(with_unscaled_losses(lambda each: call_step_hook(module, "predict_step", each)),
                                   args=(batch,))
        return tf.nest.map_structure(lambda t: strategy.gather(t, axis=0), outputs)

    return tf.function(predict, reduce_retracing=True)
