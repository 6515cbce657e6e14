"""Variables <-> the arrays of a checkpoint: stable keys, a compatibility check, and assignment."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ktrainer.checkpoint.slices import SavedSlices
from ktrainer.compat.tensorflow_parts import bfloat16_view

__all__ = ["keyed", "read_value", "host_view", "start_host_copies", "mismatches", "assign_all", "refuse_mismatches"]


def keyed(variables: Sequence[Any]) -> dict[str, Any]:
    """Variables by key "index:path", in their order (the order is what matches them on resume)."""
    return {f"{index:05d}:{variable.path}": variable for index, variable in enumerate(variables)}


def read_value(variable: Any) -> np.ndarray:
    """A variable's current value as a read-only host array that later updates of the variable leave unchanged.

    On TensorFlow this is zero-copy: the array views the buffer of a read of the variable, and
    the runtime copies that buffer on the next write to the variable while the view lives
    (copy-on-write), so a snapshot costs nothing until the variable changes. On JAX, an array on
    an accelerator is read with its one copy to the host (a JAX array never changes; start the
    copies of a whole state first with `start_host_copies`); elsewhere a copy.
    """
    read = _tensorflow_read(variable)
    if read is None:
        device_array = _on_accelerator(variable)
        if device_array is not None:  # a JAX array never changes: its copy to the host is the snapshot
            return np.asarray(device_array)
        return np.array(host_view(variable), copy=True)
    tensor = read()
    if "CPU" not in getattr(tensor, "device", "CPU"):
        return tensor.numpy()  # on an accelerator: one copy to the host is the snapshot
    try:
        return np.from_dlpack(tensor)
    except (RuntimeError, TypeError, BufferError, ValueError):
        pass
    try:
        viewed = bfloat16_view(tensor)
        if viewed is not None:
            return viewed
    except (RuntimeError, TypeError, BufferError, ValueError):
        pass
    return tensor.numpy()


def host_view(variable: Any) -> np.ndarray | None:
    """The host array `read_value` copies to snapshot `variable`: a view of the buffer of a JAX array on a CPU
    (which a donated step may reuse); None where `read_value` reads without copying (a TensorFlow variable, a
    JAX array on an accelerator)."""
    if _tensorflow_read(variable) is not None or _on_accelerator(variable) is not None:
        return None
    return np.asarray(variable)


def _tensorflow_read(variable: Any) -> Callable[[], Any] | None:
    read = getattr(variable, "read_value", None)  # a TensorFlow variable
    if read is None:
        read = getattr(getattr(variable, "value", None), "read_value", None)  # a Keras variable on TensorFlow
    return read


def start_host_copies(state: Any) -> Any:
    """Start the copy to the host of every JAX array on an accelerator in `state` (variables, arrays, in dicts and
    lists), so that the reads of a snapshot overlap their transfers instead of waiting for each in turn.

    Returns:
        `state` itself.
    """
    if isinstance(state, dict):
        for value in state.values():
            start_host_copies(value)
    elif isinstance(state, list | tuple):
        for value in state:
            start_host_copies(value)
    else:
        device_array = _on_accelerator(state)
        if device_array is not None:
            device_array.copy_to_host_async()
    return state


def _on_accelerator(value: Any) -> Any:
    """The JAX array behind `value` (a Keras variable or the array) when it lives on an accelerator; else None."""
    array = getattr(value, "value", value)
    if not callable(getattr(array, "copy_to_host_async", None)) or not getattr(array, "is_fully_addressable", False):
        return None
    return None if any(device.platform == "cpu" for device in array.devices()) else array


def _structural(key: str) -> str:
    """A key without Keras's per-process numbering ("00003:sequential_7/dense_14" -> "sequential/dense")."""
    return re.sub(r"_\d+(?=/|_|$)", "", key.split(":", 1)[-1])


def mismatches(what: str, saved: dict[str, Any], variables: Sequence[Any]) -> list[str]:
    """Why the saved arrays do not fit these variables (count, names, shapes); empty when they do."""
    problems = []
    current = keyed(variables)
    if len(saved) != len(current):
        problems.append(f"{what}: the checkpoint has {len(saved)} variables, this {what} has {len(current)}")
    for (saved_key, array), (key, variable) in zip(saved.items(), current.items(), strict=False):
        if _structural(saved_key) != _structural(key) or tuple(np.shape(array)) != tuple(variable.shape):
            problems.append(f"{what} variable {key.split(':', 1)[0]}: checkpoint {saved_key.split(':', 1)[-1]} "
                            f"{tuple(np.shape(array))} vs {key.split(':', 1)[1]} {tuple(variable.shape)}")
    return problems


def assign_all(saved: dict[str, Any], variables: Sequence[Any],
               place: Callable[[Any, SavedSlices], None] | None = None,
               host_value: Callable[[Any, np.ndarray], Any] | None = None) -> None:
    """Assign the saved arrays to the variables, in order (after `mismatches` found none).

    Args:
        saved: Key -> array, or `SavedSlices` for a variable saved sharded.
        variables: The variables, in the saved order.
        place: Assigns a sharded variable's slices to a variable (the engine's: each device's region read
            alone); None: the whole array is put together and assigned.
        host_value: Turns a host array into the value assigned (the engine's `host_value`, which may use the
            array's memory in place); None: the array is assigned as it is.
    """
    for array, variable in zip(saved.values(), variables, strict=True):
        if isinstance(array, SavedSlices):
            if place is not None:
                place(variable, array)
                continue
            array = np.asarray(array)
        if host_value is not None:
            array = host_value(variable, array)
        backing = getattr(variable, "value", None)
        if _dtype_name(variable) == _dtype_name(array) and callable(getattr(backing, "assign", None)):
            backing.assign(array)  # the backend variable itself: half the time of Keras's converting assign
        else:
            variable.assign(array)


def _dtype_name(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return str(getattr(dtype, "name", dtype))


def refuse_mismatches(problems: Sequence[str], what: str) -> None:
    """Refuse a checkpoint whose arrays do not fit `what` ("this model", ...), before anything is loaded.

    Raises:
        ValueError: Listing the first mismatches, when there are any.
    """
    if problems:
        listed = "\n  ".join(problems[:8])
        raise ValueError(f"The checkpoint does not match {what}; nothing was loaded. First mismatches:\n  {listed}")
