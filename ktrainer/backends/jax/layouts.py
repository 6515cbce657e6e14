"""JAX: which slice of each variable each device holds, checked: the user's layouts, and the "fsdp" rule.

`CheckedLayouts` is the Keras `ModelParallel` distribution a sharded run sets before `build()`: a variable
is created already split the way its layout says, and an optimizer's moments take their variable's layout.
Keras itself ignores a layout key that matches nothing and fails deep inside a layer's build on an axis
that does not divide a dimension; here each is an error that names the variable, its shape and the axis,
raised before anything trains or is written. Under "fsdp" a variable no layout names is sharded along its
largest dimension the batch axis divides, when it has at least `fsdp_min_bytes`; smaller ones are replicated
(their slices would cost more in collectives than they save in memory).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from ktrainer.compat.keras_internals import variable_layout

__all__ = ["CheckedLayouts", "layouts_of", "OUTPUT_SUFFIX"]

OUTPUT_SUFFIX = "/output"  # a key for a layer's output (Keras's get_tensor_layout), not for a variable

Axes = tuple[Any, ...]


def layouts_of(returned: Any, mesh: keras.distribution.DeviceMesh, hook: str) -> dict[str, Axes]:
    """What `configure_layout` returned (a LayoutMap, a dict or None) as {regex: axes}, each axis checked.

    Raises:
        TypeError: For anything but a LayoutMap, a dict or None, or a key that is not a string.
        ValueError: For an axes value that is not a tuple, a name the mesh does not have, or a bad regex.
    """
    if returned is None:
        return {}
    if not isinstance(returned, keras.distribution.LayoutMap | Mapping):
        raise TypeError(f"{hook} returned {type(returned).__name__}; it must return a keras.distribution.LayoutMap, "
                        "a dict {regex on variable.path: axes tuple} such as {'.*dense.*kernel': (None, 'model')}, "
                        "or None.")
    layouts = {}
    for key in returned:
        if not isinstance(key, str):
            raise TypeError(f"{hook}: layout key {key!r} is not a string (a regex on variable.path).")
        try:
            re.compile(key)
        except re.error as error:
            raise ValueError(f"{hook}: layout key {key!r} is not a regular expression ({error}).") from None
        layouts[key] = _axes(returned[key], key, mesh, hook)
    return layouts


def _axes(value: Any, key: str, mesh: keras.distribution.DeviceMesh, hook: str) -> Axes:
    axes = getattr(value, "axes", value)  # a TensorLayout, or the tuple itself
    if not isinstance(axes, tuple | list):
        raise ValueError(f"{hook}: the layout of {key!r} is {value!r}; give a tuple with one entry per dimension, "
                         f"each a mesh axis name {tuple(mesh.axis_names)}, a tuple of them, or None.")
    for axis in axes:
        if isinstance(axis, tuple | list):
            raise ValueError(f"{hook}: the layout of {key!r} splits one dimension over several axes {tuple(axis)}; "
                             "Keras layouts take one mesh axis (or None) per dimension. Split another dimension "
                             "on the second axis, or make one mesh axis of their size.")
        if axis is not None and axis not in mesh.axis_names:
            raise ValueError(f"{hook}: the layout of {key!r} names axis {axis!r}, but the mesh has axes "
                             f"{tuple(mesh.axis_names)} (shape {tuple(mesh.shape)}).")
    named = [axis for axis in axes if axis is not None]
    if len(set(named)) < len(named):
        raise ValueError(f"{hook}: the layout {tuple(axes)} of {key!r} uses one mesh axis for two dimensions; each "
                         "axis splits at most one dimension of a variable.")
    return tuple(axes)


class CheckedLayouts(keras.distribution.ModelParallel):
    """A `keras.distribution.ModelParallel` whose layouts are checked, and sharded by the "fsdp" rule elsewhere.

    Args:
        device_mesh: The mesh.
        layouts: {regex fullmatched on variable.path: axes} (from `layouts_of`).
        batch_dim_name: The axis batches are split along.
        fsdp_axis: The axis "fsdp" shards variables along; None: variables no layout names are replicated.
        fsdp_min_bytes: The smallest variable "fsdp" shards.
    """

    def __init__(self, device_mesh: keras.distribution.DeviceMesh, layouts: dict[str, Axes], *,
                 batch_dim_name: str, fsdp_axis: str | None = None, fsdp_min_bytes: int = 0) -> None:
        layout_map = keras.distribution.LayoutMap(device_mesh)
        for key, axes in layouts.items():
            layout_map[key] = axes
        batch = batch_dim_name if batch_dim_name in device_mesh.axis_names else device_mesh.axis_names[0]
        super().__init__(layout_map=layout_map, batch_dim_name=batch)
        self.layouts = dict(layouts)
        self.fsdp_axis = fsdp_axis
        self.fsdp_min_bytes = fsdp_min_bytes
        self.sizes = dict(zip(device_mesh.axis_names, (int(s) for s in device_mesh.shape), strict=True))
        self.matched: dict[str, list[str]] = {key: [] for key in layouts}

    def get_variable_layout(self, variable: Any) -> keras.distribution.TensorLayout:
        """The layout of a variable being created: its own (an optimizer moment's), a key's, fsdp's, or replicated.

        Raises:
            ValueError: When two keys match the variable, or a layout does not fit its shape.
        """
        own = variable_layout(variable)
        if own is not None:
            return own
        return keras.distribution.TensorLayout(self.axes_of(variable.path, tuple(variable.shape),
                                                            variable.dtype), self.device_mesh)

    def axes_of(self, path: str, shape: tuple[int, ...], dtype: Any) -> Axes:
        """The axes of a variable at `path` of `shape` (see `get_variable_layout`)."""
        keys = [key for key in self.layouts if re.fullmatch(key, path)]
        if len(keys) > 1:
            raise ValueError(f"Variable {path!r} {shape} matches {len(keys)} layout keys {keys}; make the regexes of "
                             "configure_layout match each variable once.")
        if keys:
            self.matched[keys[0]].append(path)
            return self._checked(keys[0], path, shape)
        if self.fsdp_axis is not None:
            return self._fsdp_axes(shape, dtype)
        return (None,) * len(shape)

    def _checked(self, key: str, path: str, shape: tuple[int, ...]) -> Axes:
        axes = self.layouts[key]
        if len(axes) != len(shape):
            raise ValueError(f"Variable {path!r} has shape {shape} ({len(shape)} dimensions), but its layout {axes} "
                             f"(key {key!r}) has {len(axes)} entries; give one per dimension (None: not split).")
        for dimension, (size, axis) in enumerate(zip(shape, axes, strict=True)):
            parts = 1 if axis is None else self.sizes[axis]
            if size % parts:
                raise ValueError(f"Variable {path!r} of shape {shape}: axis {axis!r} splits dimension {dimension} "
                                 f"({size}) into {parts} parts, which does not divide it (key {key!r}). Choose a "
                                 f"dimension the axis divides, or a mesh whose {axis!r} size divides {size}.")
        return axes

    def _fsdp_axes(self, shape: tuple[int, ...], dtype: Any) -> Axes:
        size = self.sizes[self.fsdp_axis]
        nbytes = math.prod(shape) * np.dtype(getattr(dtype, "name", dtype)).itemsize
        axes: list[Any] = [None] * len(shape)
        if size == 1 or nbytes < self.fsdp_min_bytes:
            return tuple(axes)
        for dimension in sorted(range(len(shape)), key=lambda d: -shape[d]):
            if shape[dimension] % size == 0:
                axes[dimension] = self.fsdp_axis
                break
        return tuple(axes)

    def unmatched(self) -> list[str]:
        """Layout keys no variable matched (keys for a layer's output, ending in "/output", excepted)."""
        return [key for key, paths in self.matched.items() if not paths and not key.endswith(OUTPUT_SUFFIX)]
