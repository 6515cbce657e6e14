"""The compiled steps: training (tape, loss scaling, clipping, accumulation) and evaluation.

Every step function returns a flat dict of scalars: the loss and what the module logged,
plus `_batch_size` (examples in the batch) and, for training, `_applied` (1.0 when the
batch completed an optimizer step) and `_skipped` (1.0 when that step was skipped for
non-finite gradients). `CompiledSteps` runs up to `steps_per_execution` of them in one
`tf.function` call and returns each step's values, so logging stays per step while the
Python overhead is paid once per execution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ktrainer.module import LogOptions

__all__ = ["CompiledSteps", "TrainStep", "EvalStep", "compile_predict_step", "BATCH_SIZE", "APPLIED", "SKIPPED",
           "LOSS_SCALE"]

BATCH_SIZE = "_batch_size"
APPLIED = "_applied"
SKIPPED = "_skipped"
LOSS_SCALE = "precision/loss_scale"


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
        self._step_fn = step_fn
        self._strategy = strategy
        self._keys = list(output_keys)
        self._function = tf.function(self._run_steps, jit_compile=jit_compile)
        self._concrete = None
        self._step_counts: dict[int, tf.Tensor] = {}

    def run(self, iterator: Any, num_steps: int) -> dict[str, np.ndarray]:
        """Run up to `num_steps` batches from `iterator`; stops early when it is exhausted.

        Returns:
            Each key's per-step values (empty arrays when the iterator was already exhausted).
        """
        if num_steps not in self._step_counts:
            self._step_counts[num_steps] = tf.constant(num_steps, tf.int32)
        count = self._step_counts[num_steps]
        # Calling the traced graph directly skips tf.function's per-call signature matching,
        # which costs more than a small model's step.
        if self._concrete is None:
            self._concrete = self._function.get_concrete_function(iterator, count)
        values = self._concrete(iterator, count).numpy()
        return dict(zip(self._keys, values, strict=True))

    def _run_steps(self, iterator: Any, num_steps: tf.Tensor) -> tf.Tensor:
        values = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=(len(self._keys),))
        for index in tf.range(num_steps):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            outputs = self._replicated_step(optional.get_value())
            values = values.write(index, tf.stack([outputs[key] for key in self._keys]))
        return tf.transpose(values.stack())

    def _replicated_step(self, batch: Any) -> dict[str, tf.Tensor]:
        per_replica = self._strategy.run(self._step_fn, args=(batch,))
        reduced = {}
        for key in self._keys:
            how = tf.distribute.ReduceOp.SUM if key == BATCH_SIZE else tf.distribute.ReduceOp.MEAN
            reduced[key] = self._strategy.reduce(how, per_replica[key], axis=None)
        return reduced


def discover_outputs(step_fn: Callable[[Any], dict], element_spec: Any) -> list[str]:
    """Trace `step_fn` once on the data's element spec and return its output keys.

    Tracing builds the model's variables (a subclassed model may not be built yet) and runs
    the checks on the loss and logged values, before anything is trained or written.
    """
    concrete = tf.function(step_fn).get_concrete_function(element_spec)
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


class TrainStep:
    """The training step of one batch: loss, gradients, accumulation, clipping, optimizer update.

    Gradients of `accumulate_grad_batches` batches are averaged before one update; clipping
    (by global norm) acts on the unscaled, averaged gradients.

    Args:
        module: The user's Module (its `model` already built).
        optimizer: The optimizer, built on the model's trainable variables.
        precision: The precision plugin.
        gradient_clip_val: Clip the global gradient norm to this value; None: no clipping.
        accumulate_grad_batches: Batches per optimizer update.
    """

    def __init__(self, module: Any, optimizer: Any, precision: Any, *,
                 gradient_clip_val: float | None, accumulate_grad_batches: int) -> None:
        self.module = module
        self.optimizer = optimizer
        self.precision = precision
        self.clip = gradient_clip_val
        self.accumulate = accumulate_grad_batches
        self._sums = None
        self._count = None

    def build(self) -> None:
        """Create the accumulation variables (call inside the strategy scope, after the model exists)."""
        if self.accumulate > 1:
            variables = self.module.model.trainable_variables
            self._sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]
            self._count = tf.Variable(0, dtype=tf.int64, trainable=False)

    def forward(self, batch: Any) -> dict[str, tf.Tensor]:
        """Loss and logs of a batch, without gradients (used to discover the outputs)."""
        _, logs = self._loss_and_logs(batch)
        flag = tf.constant(0.0)
        return {**logs, **self._precision_logs(), BATCH_SIZE: batch_size_of(batch), APPLIED: flag, SKIPPED: flag}

    def __call__(self, batch: Any) -> dict[str, tf.Tensor]:
        """One training step on one (per-replica) batch."""
        variables = self.module.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, logs = self._loss_and_logs(batch)
            scaled = self.precision.scale_loss(loss, self.optimizer)
        gradients = tape.gradient(scaled, variables)
        gradients = self.precision.unscale_gradients(gradients, self.optimizer)
        if self.accumulate == 1:
            applied, skipped = tf.constant(1.0), self._apply(gradients)
        else:
            applied, skipped = self._accumulate(gradients)
        return {**logs, **self._precision_logs(), BATCH_SIZE: batch_size_of(batch), APPLIED: applied,
                SKIPPED: skipped}

    def flush(self) -> tuple[bool, bool]:
        """Apply the gradients accumulated so far (at epoch end).

        Returns:
            (stepped, skipped): whether an optimizer step was taken, and whether it was skipped
            for non-finite gradients.
        """
        if self.accumulate == 1 or int(self._count.numpy()) == 0:
            return False, False
        return True, bool(self._flush_function().numpy())

    @tf.function
    def _flush_function(self) -> tf.Tensor:
        skipped = self._apply([s / tf.cast(self._count, s.dtype) for s in self._sums])
        self._reset_sums()
        return skipped

    def _loss_and_logs(self, batch: Any) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        self.module._stage = "train"
        self.module._take_logged()
        loss = check_loss(self.module.training_step(batch), "training_step")
        self.module.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss, scalar_logs(self.module._take_logged(), "training_step")

    def _precision_logs(self) -> dict[str, tf.Tensor]:
        scale = self.precision.loss_scale(self.optimizer)
        if scale is None:
            return {}
        self.module._log_options[LOSS_SCALE] = LogOptions(on_step=True, on_epoch=False, prog_bar=True)
        return {LOSS_SCALE: tf.cast(tf.convert_to_tensor(scale), tf.float32)}

    def _accumulate(self, gradients: list) -> tuple[tf.Tensor, tf.Tensor]:
        for total, gradient in zip(self._sums, gradients, strict=True):
            if gradient is not None:
                total.assign_add(tf.convert_to_tensor(gradient))
        self._count.assign_add(1)

        def apply_mean():
            skipped = self._apply([s / tf.cast(self.accumulate, s.dtype) for s in self._sums])
            self._reset_sums()
            return tf.constant(1.0), skipped

        return tf.cond(self._count >= self.accumulate, apply_mean, lambda: (tf.constant(0.0), tf.constant(0.0)))

    def _reset_sums(self) -> None:
        for total in self._sums:
            total.assign(tf.zeros_like(total))
        self._count.assign(0)

    def _apply(self, gradients: list) -> tf.Tensor:
        """Clip and apply through the precision plugin; returns 1.0 if the step was skipped."""
        variables = self.module.model.trainable_variables
        pairs = [(g, v) for g, v in zip(gradients, variables, strict=True) if g is not None]
        if not pairs:
            raise ValueError(
                "No gradient reaches any trainable variable: the loss returned by training_step "
                "does not depend on self.model's weights. Compute the loss from self.model(...)."
            )

        def update(optimizer, grads):
            if self.clip is not None:
                grads, _ = tf.clip_by_global_norm(grads, self.clip)
            optimizer.apply(grads, [v for _, v in pairs])

        return tf.cast(self.precision.apply(self.optimizer, update, [g for g, _ in pairs]), tf.float32)


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
        returned = getattr(self.module, self.hook)(batch)
        if returned is not None:
            self.module.log(f"{self.prefix}/loss", check_loss(returned, self.hook))
        logs = scalar_logs(self.module._take_logged(), self.hook)
        return {**logs, BATCH_SIZE: batch_size_of(batch)}


def compile_predict_step(module: Any, strategy: tf.distribute.Strategy) -> Callable[[Any], Any]:
    """Return a compiled function of one batch that runs `module.predict_step` on every replica."""

    def predict(batch):
        module._stage = "predict"
        outputs = strategy.run(module.predict_step, args=(batch,))
        return tf.nest.map_structure(lambda t: strategy.gather(t, axis=0), outputs)

    return tf.function(predict, reduce_retracing=True)


def to_numpy(structure: Any) -> Any:
    """Convert a structure of tensors to numpy arrays."""
    return keras.tree.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, structure)
