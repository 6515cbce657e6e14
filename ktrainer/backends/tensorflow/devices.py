"""accelerator / devices / strategy / num_nodes -> a checked plan, and the tf.distribute strategy it makes."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from ktrainer.backends.device_arguments import (
    check_device_arguments,
    check_one_device,
    chosen_indices,
    is_keras_distribution,
)
from ktrainer.backends.device_list import requested_indices

__all__ = ["DevicePlan", "plan_devices"]

log = logging.getLogger("ktrainer")

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")


@dataclass(frozen=True)
class DevicePlan:
    """Where a run executes.

    Attributes:
        accelerator: "cpu", "gpu" or "tpu".
        devices: Device names in this process, e.g. ("/gpu:0", "/gpu:1").
        strategy: "one_device", "mirrored", "multi_worker" or "tpu" (or "custom").
        num_nodes: Worker processes (1 unless multi-worker).
        custom: A user-given tf.distribute.Strategy, used as it is.
    """

    accelerator: str
    devices: tuple[str, ...]
    strategy: str
    num_nodes: int = 1
    custom: Any = None

    @property
    def is_chief(self) -> bool:
        """True in the process that writes logs and checkpoints: the chief, else worker 0 (one process: True)."""
        if self.strategy != "multi_worker":
            return True
        task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
        if "chief" in _cluster():
            return task.get("type") == "chief"
        return task.get("type", "worker") == "worker" and task.get("index", 0) == 0

    def make_strategy(self) -> tf.distribute.Strategy:
        """Create the tf.distribute strategy of this plan."""
        if self.custom is not None:
            return self.custom
        if self.strategy == "one_device":
            if self.devices[0].endswith(":0"):
                # TensorFlow's default strategy already runs on the first device, and feeds it about twice
                # as fast as OneDeviceStrategy's distributed dataset (benchmarks/fit_overhead.py).
                return tf.distribute.get_strategy()
            return tf.distribute.OneDeviceStrategy(self.devices[0])
        if self.strategy == "mirrored":
            # On logical CPUs, collective all-reduce keys clash between two strategies of different sizes
            # in one process; reducing through one device has no such state and costs nothing there.
            cross = tf.distribute.ReductionToOneDevice() if self.accelerator == "cpu" else None
            return tf.distribute.MirroredStrategy(list(self.devices), cross_device_ops=cross)
        if self.strategy == "multi_worker":
            return tf.distribute.MultiWorkerMirroredStrategy()
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)


def _cluster() -> dict:
    return json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})


def plan_devices(accelerator: str = "auto", devices: Any = "auto", strategy: Any = "auto",
                 num_nodes: int = 1, mesh: Any = None, fsdp_min_bytes: int = 0) -> DevicePlan:
    """Check the Trainer's device arguments against the machine and return the plan.

    With `devices=N` and no GPU, the CPU is split into N logical devices (this must happen
    before TensorFlow initializes its devices; see the error raised otherwise).

    Raises:
        ValueError: For values that are wrong, conflict with each other, or ask for more devices
            than are visible (the message names what is visible).
    """
    refuse_sharding(strategy, mesh)
    if check_device_arguments(accelerator, strategy, num_nodes, STRATEGIES, _is_strategy_object):
        return DevicePlan("custom", (), "custom", num_nodes, custom=strategy)
    multi_worker = strategy == "multi_worker" or num_nodes > 1 or (strategy == "auto" and "TF_CONFIG" in os.environ
                                                                   and len(_cluster_tasks()) > 1)
    gpus = tf.config.list_physical_devices("GPU")
    tpus = tf.config.list_physical_devices("TPU")
    if accelerator == "auto":
        accelerator = "tpu" if tpus else "gpu" if gpus else "cpu"
    if accelerator == "gpu" and not gpus:
        raise ValueError("accelerator='gpu', but TensorFlow sees no GPU. Use accelerator='cpu' (or 'auto').")
    if (accelerator == "tpu" or strategy == "tpu") and not tpus:
        raise ValueError("accelerator/strategy 'tpu', but TensorFlow sees no TPU. Use accelerator='auto'.")
    if accelerator == "tpu" or strategy == "tpu":
        return DevicePlan("tpu", (), "tpu")
    if multi_worker:
        if strategy not in ("auto", "multi_worker"):
            raise ValueError(f"strategy={strategy!r} cannot run on num_nodes={num_nodes} nodes (or a TF_CONFIG "
                             "cluster); use strategy='multi_worker' or 'auto'.")
        check_cluster_description(num_nodes)
        return DevicePlan(accelerator, (), "multi_worker", max(num_nodes, len(_cluster_tasks())))
    indices = _device_indices(devices, accelerator, len(gpus))
    check_one_device(strategy, devices, len(indices), "mirrored")
    if accelerator == "gpu":
        names = tuple(f"/gpu:{i}" for i in indices)
    else:
        names = tuple(f"/cpu:{i}" for i in indices)
        _split_cpu(max(indices) + 1, devices)
    chosen = strategy if strategy != "auto" else ("mirrored" if len(names) > 1 else "one_device")
    return DevicePlan(accelerator, names, chosen)


def check_cluster_description(num_nodes: int) -> None:
    """`num_nodes > 1` needs a TF_CONFIG naming this process's place in a cluster of that many workers.

    Raises:
        ValueError: Naming TF_CONFIG, SLURM and `ktrainer launch`, instead of one process training alone.
    """
    tasks = _cluster_tasks()
    if num_nodes > 1 and "TF_CONFIG" not in os.environ:
        slurm = " (this is a SLURM job: build TF_CONFIG from SLURM's variables, see docs/distributed.md)" if (
            "SLURM_JOB_ID" in os.environ) else ""
        raise ValueError(
            f"num_nodes={num_nodes} needs a cluster description, but TF_CONFIG is not set{slurm}: this process would "
            f"train alone. Start the workers with `ktrainer launch --nodes {num_nodes} -- <command>` (one machine), "
            "set TF_CONFIG on every node (Kubernetes operators do), or under SLURM build it from SLURM's variables "
            "(docs/distributed.md). For one machine, leave num_nodes=1."
        )
    if num_nodes > 1 and len(tasks) != num_nodes:
        raise ValueError(f"num_nodes={num_nodes}, but TF_CONFIG describes a cluster of {len(tasks)} tasks. Make them "
                         "agree (or leave num_nodes=1 and let TF_CONFIG decide).")


def refuse_sharding(strategy: Any, mesh: Any) -> None:
    """Sharded strategies and meshes are the JAX engine's (see docs/distributed.md, "Models bigger than one device").

    Raises:
        ValueError: For strategy "fsdp" or "model_parallel", a Keras distribution object, or a mesh, naming
            KERAS_BACKEND=jax as the way.
    """
    named = strategy if isinstance(strategy, str) else type(strategy).__name__
    if strategy in ("fsdp", "model_parallel") or is_keras_distribution(strategy) or mesh is not None:
        what = f"strategy={named!r}" if mesh is None else f"mesh={mesh!r}"
        raise ValueError(f"{what} shards the variables over a device mesh, which ktrainer does on the JAX backend "
                         "only: Keras's TensorFlow backend has no layout for its variables. Run with "
                         "KERAS_BACKEND=jax (the same Module works), or use strategy='auto'/'mirrored' to replicate "
                         "the model on every device.")


def _cluster_tasks() -> list:
    return [task for tasks in _cluster().values() for task in tasks]


def _is_strategy_object(strategy: Any) -> bool:
    """True for a tf.distribute.Strategy the user made (used as it is)."""
    return isinstance(strategy, tf.distribute.Strategy)


def _device_indices(devices: Any, accelerator: str, gpu_count: int) -> list[int]:
    """The indices of the GPUs (all visible by default) or logical CPUs (as many as asked) a run uses."""
    def too_few(index: int) -> str:
        return (f"devices={devices!r} asks for GPU index {index}, but only {gpu_count} GPU(s) are "
                f"visible (indices 0..{gpu_count - 1}). Check CUDA_VISIBLE_DEVICES.")

    visible = gpu_count if accelerator == "gpu" else None  # a CPU is split into as many devices as asked for
    return chosen_indices(requested_indices(devices), accelerator, visible, too_few)


def _split_cpu(count: int, asked: Any) -> None:
    """Make `count` logical CPU devices (only possible before TensorFlow initializes its devices)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) >= count:
        return
    if count == 1 and current is None:
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        have = len(tf.config.list_logical_devices("CPU"))
        if have >= count:
            return
        raise ValueError(
            f"devices={asked!r} on a CPU needs {count} logical CPU devices, but TensorFlow has already initialized "
            f"its devices with {have}. Create the Trainer before creating any tensor or tf.data.Dataset (e.g. "
            "build datasets in the module's train_data() hook, not at import time), or run in a fresh process."
        ) from error
    log.info("Split the CPU into %d logical devices for devices=%d.", count, count)
