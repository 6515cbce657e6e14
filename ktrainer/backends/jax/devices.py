"""JAX: accelerator / devices / strategy / num_nodes -> a checked plan over `jax.devices()`; jax.distributed.

On a machine without GPUs, `devices=N` gives N virtual CPU devices (`jax_num_cpu_devices`), as the
TensorFlow engine splits the CPU into logical devices; this must happen before JAX runs anything.
With `num_nodes > 1`, or in processes a launcher started (Keras's variables name several), the processes
meet through `keras.distribution.initialize` (jax.distributed): `ktrainer launch` sets the coordinator's
address, the process count and each process's id.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import keras

from ktrainer.backends.device_arguments import check_device_arguments, check_one_device, chosen_indices
from ktrainer.backends.device_list import requested_indices
from ktrainer.backends.jax.mesh import DEFAULT_FSDP_MIN_BYTES, SHARDED, MeshPlan, backend_mesh, check_mesh

__all__ = ["JaxDevicePlan", "plan_devices", "joins_processes", "COORDINATOR", "NUM_PROCESSES", "PROCESS_ID"]

log = logging.getLogger("ktrainer")

STRATEGIES = ("auto", "one_device", "data_parallel", "mirrored", "multi_worker", *SHARDED)
# Keras's own names (keras.distribution.initialize reads them); `ktrainer launch` sets them.
COORDINATOR = "KERAS_DISTRIBUTION_JOB_ADDRESSES"  # host:port of process 0
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"


@dataclass(frozen=True)
class JaxDevicePlan:
    """Where a run executes on JAX.

    Attributes:
        accelerator: "cpu", "gpu" or "tpu".
        device_ids: Indices into `jax.local_devices()` this process uses.
        strategy: "one_device", "data_parallel", "fsdp" or "model_parallel".
        num_nodes: Processes training together.
        mesh: The device mesh of a sharded strategy (or of a Keras distribution given); None otherwise.
    """

    accelerator: str
    device_ids: tuple[int, ...]
    strategy: str
    num_nodes: int = 1
    mesh: MeshPlan | None = None

    @property
    def is_chief(self) -> bool:
        """True in process 0 (the one that writes logs and checkpoints)."""
        return jax.process_index() == 0

    @property
    def devices(self) -> tuple[str, ...]:
        """Device names, e.g. ("cpu:0", "cpu:1")."""
        return tuple(f"{self.accelerator}:{i}" for i in self.device_ids)

    def jax_devices(self) -> list[Any]:
        """The devices of every process (a global mesh): each process's chosen local devices."""
        given = getattr(self.mesh, "given", None)
        if given is not None:
            return list(backend_mesh(getattr(given, "device_mesh", given)).devices.flat)
        if self.num_nodes == 1:
            local = jax.local_devices()
            return [local[i] for i in self.device_ids]
        return list(jax.devices())


def plan_devices(accelerator: str = "auto", devices: Any = "auto", strategy: Any = "auto",
                 num_nodes: int = 1, mesh: Any = None,
                 fsdp_min_bytes: int = DEFAULT_FSDP_MIN_BYTES) -> JaxDevicePlan:
    """Check the Trainer's device arguments against JAX's devices and return the plan.

    A sharded strategy with a mesh and `devices="auto"` uses as many devices as the mesh spans (virtual ones
    on a CPU); `devices=N` must give the mesh exactly its devices.

    Raises:
        ValueError: For values that are wrong, conflict, or ask for devices that are not there
            (naming what is visible), a mesh that does not fit the devices, or several nodes without a
            coordinator.
    """
    sharded = check_mesh(strategy, mesh, fsdp_min_bytes)
    if sharded is not None and sharded.given is not None:
        return _given_mesh_plan(accelerator, devices, num_nodes, sharded)
    check_device_arguments(accelerator, strategy, num_nodes, STRATEGIES, _refuse_strategy_object)
    requested = requested_indices(devices)  # checked before JAX starts
    if sharded is not None and sharded.axes and requested is None and devices == "auto" \
            and accelerator in ("auto", "cpu") and num_nodes == 1:
        requested = list(range(sharded.device_count))  # on a machine with GPUs, the GPUs are counted below
    count = None if requested is None else max(requested) + 1
    together = joins_processes(num_nodes, strategy, os.environ)
    if together and strategy == "one_device":
        raise ValueError(f"strategy='one_device' conflicts with several processes training together (num_nodes="
                         f"{num_nodes}, {NUM_PROCESSES}={os.environ.get(NUM_PROCESSES)}). Use strategy='data_parallel' "
                         "(or 'auto').")
    if count is not None and count > 1 and accelerator in ("auto", "cpu"):
        _virtual_cpus(count, devices)  # before a join too: each process's own devices
    if together:
        _join_processes(num_nodes)
    platform = jax.default_backend()
    if accelerator == "auto":
        accelerator = platform if platform in ("gpu", "tpu") else "cpu"
    if accelerator != "cpu" and platform != accelerator:
        raise ValueError(f"accelerator={accelerator!r}, but JAX runs on {platform!r} ({jax.devices()}). Install "
                         f"jax with {accelerator} support, or use accelerator='auto'.")
    local = jax.local_devices(backend=accelerator)
    indices = _device_indices(requested, devices, accelerator, len(local))
    check_one_device(strategy, devices, len(indices), "data_parallel")
    processes = max(num_nodes, jax.process_count())
    if sharded is not None:
        sharded = _fitted_mesh(sharded.with_devices(len(indices) * processes), len(indices) * processes, devices)
        return JaxDevicePlan(accelerator, tuple(indices), sharded.strategy, processes, sharded)
    several = len(indices) > 1 or processes > 1
    return JaxDevicePlan(accelerator, tuple(indices), "data_parallel" if several else "one_device", processes)


def _fitted_mesh(sharded: MeshPlan, count: int, devices: Any) -> MeshPlan:
    """The mesh, checked to span exactly the `count` devices of the run.

    Raises:
        ValueError: Naming the mesh, its device count and the devices the run has.
    """
    if sharded.device_count != count:
        raise ValueError(f"mesh {sharded.describe()} spans {sharded.device_count} devices, but the run has {count} "
                         f"(devices={devices!r}). Make the product of the axis sizes equal the devices of all "
                         f"processes, or leave devices='auto' to use as many as the mesh spans.")
    return sharded


def _given_mesh_plan(accelerator: str, devices: Any, num_nodes: int, sharded: MeshPlan) -> JaxDevicePlan:
    """The plan of a Keras DeviceMesh or distribution the user made: its own devices, as they are."""
    check_device_arguments(accelerator, "auto", num_nodes, STRATEGIES, _refuse_strategy_object)
    if devices != "auto":
        raise ValueError(f"devices={devices!r} conflicts with the Keras device mesh given, which names its devices "
                         "itself. Leave devices='auto'.")
    mesh_devices = list(backend_mesh(getattr(sharded.given, "device_mesh", sharded.given)).devices.flat)
    platform = mesh_devices[0].platform
    local = [d for d in mesh_devices if d.process_index == jax.process_index()]
    ids = tuple(jax.local_devices(backend=platform).index(d) for d in local)
    return JaxDevicePlan(platform, ids, sharded.strategy, max(num_nodes, jax.process_count()), sharded)


def joins_processes(num_nodes: int, strategy: str, environ: Mapping[str, str]) -> bool:
    """Whether this process trains with others: `num_nodes > 1`, strategy "multi_worker", or a launcher that
    named several processes in Keras's variables (as a TF_CONFIG cluster does on TensorFlow).

    Without the last case, `ktrainer launch --nodes 2 -- ktrainer fit ...` would start two runs that each train
    alone and both write as process 0.
    """
    launched = environ.get(NUM_PROCESSES, "1")
    return (num_nodes > 1 or strategy == "multi_worker"
            or (COORDINATOR in environ and launched.isdigit() and int(launched) > 1))


def _refuse_strategy_object(strategy: Any) -> bool:
    """False for a strategy name (checked next); a Keras distribution object was taken before (`check_mesh`).

    Raises:
        ValueError: For anything but a string, naming the JAX strategies and the TensorFlow backend.
    """
    if not isinstance(strategy, str):
        raise ValueError(f"strategy={strategy!r}: on the JAX backend the strategy is one of {STRATEGIES} or a "
                         "keras.distribution.ModelParallel / DataParallel; a tf.distribute.Strategy object needs "
                         "KERAS_BACKEND=tensorflow.")
    return False


def _device_indices(requested: list[int] | None, devices: Any, accelerator: str, visible: int) -> list[int]:
    """The indices of this process's devices a run uses (all of an accelerator's by default, one CPU)."""
    def too_few(index: int) -> str:
        return (f"devices={devices!r} asks for {accelerator} index {index}, but JAX sees {visible} "
                f"{accelerator} device(s) in this process (indices 0..{visible - 1}).")

    return chosen_indices(requested, accelerator, visible, too_few)


def _virtual_cpus(count: int, asked: Any) -> None:
    """Make `count` virtual CPU devices (only possible before JAX initializes its backends)."""
    try:
        jax.config.update("jax_num_cpu_devices", max(count, jax.config.jax_num_cpu_devices))
    except RuntimeError as error:
        have = len(jax.local_devices(backend="cpu"))
        if have >= count:
            return
        raise ValueError(
            f"devices={asked!r} on a CPU needs {count} virtual CPU devices, but JAX already started with {have}. "
            "Create the Trainer before running any JAX or Keras operation (e.g. build arrays in the module's "
            f"hooks), or set XLA_FLAGS=--xla_force_host_platform_device_count={count} before starting Python."
        ) from error


def _join_processes(num_nodes: int) -> None:
    """Meet the other processes through jax.distributed (once per process)."""
    if jax.distributed.is_initialized():  # asking jax.process_count() would start JAX too early
        return
    address = os.environ.get(COORDINATOR)
    if address is None:
        raise ValueError(
            f"num_nodes={num_nodes} on the JAX backend needs the coordinator's address, but {COORDINATOR} is not set: "
            f"this process would train alone. Start the processes with `ktrainer launch --nodes {num_nodes} -- "
            f"<command>` (one machine), or set {COORDINATOR} (host:port of process 0), {NUM_PROCESSES} and "
            f"{PROCESS_ID} on every node (docs/distributed.md has SLURM and Kubernetes recipes)."
        )
    processes = int(os.environ.get(NUM_PROCESSES, num_nodes))
    if num_nodes > 1 and processes != num_nodes:
        raise ValueError(f"num_nodes={num_nodes}, but {NUM_PROCESSES}={processes}. Make them agree.")
    process_id = os.environ.get(PROCESS_ID, "")
    if not process_id.isdigit() or int(process_id) >= processes:
        raise ValueError(f"{PROCESS_ID}={process_id!r}: each of the {processes} processes needs its own id, 0 to "
                         f"{processes - 1} (0 on the coordinator's host). Set it per process, or start them with "
                         f"`ktrainer launch --nodes {processes} -- <command>`.")
    keras.distribution.initialize(address, processes, int(process_id))
    log.info("Joined %d processes through %s as process %d.", processes, address, jax.process_index())
