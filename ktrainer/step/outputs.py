"""What every backend's compiled step returns, and the checks on what a step hook gives: backend-neutral.

A step returns a flat dict of float32 scalars: the loss and what the module logged, plus
`_batch_size` (examples in the batch) and, for training, `_applied` (1.0 when the batch completed
an optimizer step), `_skipped` (1.0 when that step was skipped for non-finite gradients) and, in
multi-process runs, `_stop` (> 0 when any process received a preemption signal, the same on all) and
`_clock` (the chief's seconds since the fit started: the run's one clock, see run_clock.py).
"""

from __future__ import annotations

from typing import Any

import keras

from ktrainer.module import module_runtime
from ktrainer.step.hooks import call_step_hook, loss_from_return

__all__ = ["BATCH_SIZE", "APPLIED", "SKIPPED", "LOSS_SCALE", "STOP", "CLOCK", "SAME_ON_EVERY_REPLICA", "batch_size_of",
           "scalar_logs", "check_loss", "with_model_losses", "EvalStep"]

BATCH_SIZE = "_batch_size"
APPLIED = "_applied"
SKIPPED = "_skipped"
LOSS_SCALE = "precision/loss_scale"
STOP = "_stop"
CLOCK = "_clock"
SAME_ON_EVERY_REPLICA = (APPLIED, SKIPPED, LOSS_SCALE, STOP, CLOCK)


def batch_size_of(batch: Any) -> Any:
    """Number of examples in a batch, as a float32 scalar: the leading dimension of its first tensor."""
    first = keras.tree.flatten(batch)[0]
    return keras.ops.cast(keras.ops.shape(first)[0], "float32")


def scalar_logs(logged: dict[str, Any], hook: str) -> dict[str, Any]:
    """Check that every value logged by `hook` is a scalar and cast it to float32.

    Raises:
        ValueError: Naming the value and its shape.
    """
    out = {}
    for name, value in logged.items():
        tensor = keras.ops.convert_to_tensor(value)
        if len(tensor.shape) != 0:
            raise ValueError(
                f"self.log({name!r}, ...) in {hook} got a value of shape {tuple(tensor.shape)}; logged "
                "values must be scalars. Reduce it first, e.g. keras.ops.mean(value)."
            )
        out[name] = keras.ops.cast(tensor, "float32")
    return out


def check_loss(loss: Any, hook: str) -> Any:
    """Return `loss` as a tensor if it is a scalar float.

    Raises:
        ValueError: With the shape or dtype found.
    """
    if loss is None:
        raise ValueError(f"{hook} returned None; it must return the scalar float loss of the batch.")
    tensor = keras.ops.convert_to_tensor(loss)
    if len(tensor.shape) != 0:
        raise ValueError(
            f"{hook} returned a loss of shape {tuple(tensor.shape)}; it must be a scalar. Reduce it, "
            "e.g. keras.ops.mean(per_example_loss)."
        )
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if "float" not in dtype:
        raise ValueError(
            f"{hook} returned a loss of dtype {dtype}; it must be a float. "
            "Cast it, e.g. keras.ops.cast(loss, 'float32')."
        )
    return tensor


def with_model_losses(module: Any, loss: Any, prefix: str) -> Any:
    """`loss` plus the model's own losses (kernel and activity regularizers, `add_loss` terms), as Keras's `fit`
    and `evaluate` add them; their sum, in float32, is logged as `{prefix}/reg_loss`.

    Nothing is added when the model has none or `module.add_model_losses` is False.
    """
    model = module.model
    if not module.add_model_losses or model is None or not model.losses:
        return loss
    total = sum(keras.ops.sum(keras.ops.cast(term, "float32")) for term in model.losses)
    both = prefix == "train"
    module.log(f"{prefix}/reg_loss", total, on_step=both or None, on_epoch=both or None)
    return loss + keras.ops.cast(total, loss.dtype)


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

    def __call__(self, batch: Any) -> dict[str, Any]:
        """One evaluation step on one (per-replica) batch."""
        runtime = module_runtime(self.module)
        with runtime.step_hook(self.prefix):
            returned = loss_from_return(self.module, call_step_hook(self.module, self.hook, batch), self.hook,
                                        self.prefix)
        if returned is not None:
            loss = with_model_losses(self.module, check_loss(returned, self.hook), self.prefix)
            self.module.log(f"{self.prefix}/loss", loss)
        logs = scalar_logs(runtime.take_logged(), self.hook)
        return {**logs, BATCH_SIZE: batch_size_of(batch)}
