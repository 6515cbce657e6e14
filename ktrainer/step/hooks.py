"""Calling the Module's step hooks as Lightning users write them: `(batch)` or `(batch, batch_idx)`, returning
a loss or a dict with a "loss" key; and what both engines' manual optimization shares.

`batch_idx` is the batch's index within the epoch (or the evaluation run), a tensor inside the compiled
step: each backend's compiled step marks the index of the step it traces with `traced_batch_index`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import keras

__all__ = ["call_step_hook", "traced_batch_index", "loss_from_return", "takes_batch_idx", "wrapped_optimizer",
           "NO_UPDATE"]

_shared = {"index": None}  # MirroredStrategy traces each replica's step in a thread of its own


@contextmanager
def traced_batch_index(index: Any) -> Iterator[None]:
    """While tracing one step: the batch index the step hooks receive (a scalar int64 tensor)."""
    previous = _shared["index"]
    _shared["index"] = index
    try:
        yield
    finally:
        _shared["index"] = previous


def takes_batch_idx(hook: Any) -> bool:
    """True when a bound step hook takes Lightning's `batch_idx`: a second positional parameter named so, or
    without a default (`training_step(self, batch, training=True)` is not given an index)."""
    parameters = list(inspect.signature(hook).parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2:
        second = positional[1]
        return second.name == "batch_idx" or second.default is inspect.Parameter.empty
    return any(p.kind == p.VAR_POSITIONAL for p in parameters)


def call_step_hook(module: Any, name: str, batch: Any) -> Any:
    """`module.<name>(batch)`, or `(batch, batch_idx)` when the hook takes it."""
    hook = getattr(module, name)
    if not takes_batch_idx(hook):
        return hook(batch)
    index = _shared["index"]
    return hook(batch, _zero_index() if index is None else index)


def loss_from_return(module: Any, returned: Any, hook: str, prefix: str) -> Any:
    """The loss a step hook returned. A dict (Lightning's habit) gives its "loss"; its other scalar entries are
    logged (as `{prefix}/{key}` unless the key names its own prefix, e.g. "train/acc"); the rest (predictions,
    targets) are left alone, as Lightning keeps them for the hooks rather than the logs.

    Raises:
        ValueError: For a dict without a "loss" entry, naming the keys it has.
    """
    if not isinstance(returned, dict):
        return returned
    if "loss" not in returned:
        raise ValueError(f"{hook} returned a dict with keys {sorted(returned)}, but no 'loss': return the loss "
                         "tensor, or a dict whose 'loss' entry is the scalar loss (other entries are logged).")
    for key, value in returned.items():
        if key != "loss" and _is_scalar(value):
            module.log(key if "/" in key else f"{prefix}/{key}", value)
    return returned["loss"]


def _is_scalar(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    return isinstance(value, int | float) or (shape is not None and len(shape) == 0)


def _zero_index() -> Any:
    # int64 as TensorFlow's compiled steps count; JAX has 64-bit integers only with jax_enable_x64.
    return keras.ops.convert_to_tensor(0, "int64" if keras.config.backend() == "tensorflow" else "int32")


NO_UPDATE = ("training_step made no update: with automatic_optimization = False, call "
             "self.manual_step(loss_fn, optimizer, variables) in it for each update.")


def wrapped_optimizer(optimizer: Any, configured: Sequence[Any], wrapped: Sequence[Any]) -> Any:
    """The precision-wrapped optimizer of one that `manual_step` was given (the user's own, or already wrapped).

    Raises:
        ValueError: For an optimizer that configure_optimizers() did not return.
    """
    for user, ours in zip(configured, wrapped, strict=True):
        if optimizer is user or optimizer is ours:
            return ours
    raise ValueError("self.manual_step(...) got an optimizer that configure_optimizers() did not return: pass one "
                     "of self.optimizers().")
