"""JAX: the sharded strategies ("fsdp", "model_parallel", a Keras distribution) and the `mesh` argument -> a MeshPlan.

A mesh names the axes the devices are arranged on: `{"batch": 2, "model": 4}` is 8 devices in 2 rows of 4.
The "batch" axis splits every global batch (its size is the number of data-parallel replicas: the global
batch is `batch_size` x its size); the other axes exist for the layouts `Module.configure_layout` gives
(a kernel's columns on "model"). "fsdp" also shards each large variable along "batch", so the devices of a
replica group hold one slice of the state each instead of a copy of all of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import keras

from ktrainer.backends.device_arguments import is_keras_distribution

__all__ = ["MeshPlan", "SHARDED", "BATCH_AXIS", "DEFAULT_FSDP_MIN_BYTES", "check_mesh", "backend_mesh"]

SHARDED = ("fsdp", "model_parallel")
BATCH_AXIS = "batch"
DEFAULT_FSDP_MIN_BYTES = 2**20


@dataclass(frozen=True)
class MeshPlan:
    """How a sharded run arranges its devices.

    Attributes:
        strategy: "fsdp", "model_parallel", or "data_parallel" (a `keras.distribution.DataParallel` given).
        axes: (name, size) of each mesh axis, in order; empty while "fsdp" waits for the device count.
        fsdp_min_bytes: Under "fsdp", variables of at least this many bytes are sharded; smaller ones replicated.
        given: The user's `keras.distribution.DeviceMesh` or `Distribution`, used as it is; None otherwise.
        batch_axis: The axis batches are split along.
    """

    strategy: str
    axes: tuple[tuple[str, int], ...]
    fsdp_min_bytes: int = DEFAULT_FSDP_MIN_BYTES
    given: Any = None
    batch_axis: str = BATCH_AXIS

    @property
    def device_count(self) -> int:
        """Devices the mesh spans (all processes)."""
        return math.prod(size for _, size in self.axes)

    @property
    def data_replicas(self) -> int:
        """Size of the batch axis (1 when the mesh has none: every device sees the whole batch)."""
        return dict(self.axes).get(self.batch_axis, 1)

    def with_devices(self, count: int) -> MeshPlan:
        """"fsdp" without a mesh: all `count` devices on the batch axis."""
        return self if self.axes else MeshPlan(self.strategy, ((BATCH_AXIS, count),), self.fsdp_min_bytes)

    def describe(self) -> str:
        """The mesh as the fit summary shows it, e.g. "batch=2 x model=4"."""
        return " x ".join(f"{name}={size}" for name, size in self.axes)


def check_mesh(strategy: Any, mesh: Any, fsdp_min_bytes: int) -> MeshPlan | None:
    """The MeshPlan of a sharded strategy; None for the data-parallel and one-device strategies (without a mesh).

    Raises:
        ValueError: For a mesh that is not a dict of axis sizes or a DeviceMesh, a mesh with a strategy that
            does not use one, "model_parallel" without a mesh, "fsdp" with a mesh that has no "batch" axis, or
            a Keras distribution given together with a mesh.
    """
    if is_keras_distribution(strategy):
        return _given_distribution(strategy, mesh, fsdp_min_bytes)
    if strategy not in SHARDED:
        if mesh is not None:
            raise ValueError(f"mesh={mesh!r} is given, but strategy={strategy!r} does not shard anything. Use "
                             "strategy='fsdp' or 'model_parallel' with a mesh, or leave mesh=None for data parallel.")
        return None
    if mesh is None:
        if strategy == "model_parallel":
            raise ValueError("strategy='model_parallel' needs a mesh, e.g. mesh={'batch': 2, 'model': 4} (8 devices: "
                             "batches split in 2, each layer's kernel over 4), and Module.configure_layout(mesh) "
                             "saying which axis each variable is split on.")
        return MeshPlan("fsdp", (), fsdp_min_bytes)
    axes, given = _mesh_axes(mesh)
    if strategy == "fsdp" and BATCH_AXIS not in dict(axes):
        raise ValueError(f"strategy='fsdp' shards the weights along the {BATCH_AXIS!r} axis, but mesh={mesh!r} has "
                         f"axes {[name for name, _ in axes]}. Add a {BATCH_AXIS!r} axis, e.g. "
                         f"{{{BATCH_AXIS!r}: 8}} or {{{BATCH_AXIS!r}: 2, 'model': 4}}.")
    return MeshPlan(strategy, axes, fsdp_min_bytes, given)


def _given_distribution(strategy: Any, mesh: Any, fsdp_min_bytes: int) -> MeshPlan:
    if mesh is not None:
        raise ValueError(f"strategy={type(strategy).__name__}(...) brings its own device mesh; mesh={mesh!r} cannot "
                         "be given as well. Leave mesh=None, or pass strategy='model_parallel' with the mesh.")
    if not isinstance(strategy, keras.distribution.ModelParallel | keras.distribution.DataParallel):
        raise ValueError(f"strategy={type(strategy).__name__}(...): the JAX engine takes a "
                         "keras.distribution.ModelParallel or DataParallel, or one of the strategy names.")
    kind = "model_parallel" if isinstance(strategy, keras.distribution.ModelParallel) else "data_parallel"
    axes, _ = _mesh_axes(strategy.device_mesh)
    return MeshPlan(kind, axes, fsdp_min_bytes, strategy, strategy.batch_dim_name)


def _mesh_axes(mesh: Any) -> tuple[tuple[tuple[str, int], ...], Any]:
    """(axes, the DeviceMesh given or None) of a `mesh` argument.

    Raises:
        ValueError: For anything but a dict of axis names to sizes >= 1, or a DeviceMesh.
    """
    if isinstance(mesh, keras.distribution.DeviceMesh):
        return tuple(zip(mesh.axis_names, (int(size) for size in mesh.shape), strict=True)), mesh
    example = "e.g. mesh={'batch': 2, 'model': 4}, or a keras.distribution.DeviceMesh"
    if not isinstance(mesh, Mapping) or not mesh:
        raise ValueError(f"mesh={mesh!r}: give the axis names and sizes, {example}.")
    for name, size in mesh.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"mesh={mesh!r}: axis name {name!r} is not a name; {example}.")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"mesh={mesh!r}: axis {name!r} has size {size!r}; each size is an int >= 1 ({example}).")
    return tuple((name, size) for name, size in mesh.items()), None


def backend_mesh(device_mesh: keras.distribution.DeviceMesh) -> Any:
    """The `jax.sharding.Mesh` of a Keras DeviceMesh (its devices as JAX devices, whatever the DeviceMesh holds)."""
    replicated = keras.distribution.TensorLayout([None], device_mesh)
    return replicated.backend_layout.mesh
