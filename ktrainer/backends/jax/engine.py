"""The JAX engine: keras.distribution.DataParallel over the plan's devices, jitted stateless steps.

Batches are numpy global batches from the data source, placed on the mesh split along the batch
(each process gives its own slice of the same global batch). A batch that does not split evenly
over the devices (the last one of an evaluation set) is placed whole on every device instead, so
every result is exact without padding. Arrays are global, so a mean over a batch is the mean over
the global batch: no 1/replicas factor, and the finite check of loss scaling is global for free.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ktrainer.backends.accelerators import Accelerators
from ktrainer.backends.engine import Engine, Runner
from ktrainer.backends.jax.cpu_float16 import check_float16_lowers_on_cpu
from ktrainer.backends.jax.flops import matmul_flops
from ktrainer.backends.jax.layouts import CheckedLayouts, layouts_of
from ktrainer.backends.jax.mesh import backend_mesh
from ktrainer.backends.jax.runners import EvalRunner, TrainRunner, shape_spec, to_host
from ktrainer.backends.jax.state_bytes import most_loaded, replicated_bytes
from ktrainer.backends.jax.train_step import JaxTrainStep, stateless_values, tracing_scope
from ktrainer.compat.keras_internals import layout_map_of
from ktrainer.module import module_runtime
from ktrainer.step.hooks import call_step_hook, traced_batch_index
from ktrainer.step.outputs import CLOCK, STOP, EvalStep
from ktrainer.utils.memory import return_freed_memory

_TRIM_BYTES = 256 * 2**20  # a restore returns the memory it freed this often (each return costs ~15 ms per GB)

__all__ = ["JaxEngine", "compute_capability", "shape_spec", "to_host"]


class JaxEngine(Engine):
    """Runs jitted stateless steps on the plan's devices (a `DataParallel` distribution with several)."""

    name = "jax"

    def __init__(self, plan: Any) -> None:
        super().__init__(plan)
        self.strategy: keras.distribution.Distribution | None = None
        self.device_mesh: keras.distribution.DeviceMesh | None = None
        self._mesh: jax.sharding.Mesh | None = None
        self._batch_axis = "batch"
        self._distributed: Any = None  # the module the sharded distribution was made for
        self._step: JaxTrainStep | None = None
        self._stop_requested = False
        self._clock_seconds = 0.0  # this process's clock for the next execution (the chief's is agreed on)
        self._replaced_bytes = 0  # of variables on CPU devices replaced by a restore since memory was returned

    def start(self) -> None:
        """Make the distribution over the plan's devices (once); a sharded one waits for the module
        (`distribute`), whose `configure_layout` it needs."""
        if self._mesh is not None:
            return
        devices = self.plan.jax_devices()
        sharded = self.plan.mesh
        if sharded is None:
            self._mesh = jax.sharding.Mesh(np.array(devices), ("batch",))
            if len(devices) > 1 or devices[0] != jax.local_devices()[0]:  # devices=[k]: the state is made on k
                self.strategy = keras.distribution.DataParallel(devices=devices)
            return
        given = sharded.given
        self.device_mesh = getattr(given, "device_mesh", given) or keras.distribution.DeviceMesh(
            tuple(size for _, size in sharded.axes), tuple(name for name, _ in sharded.axes), devices)
        self._mesh = backend_mesh(self.device_mesh)
        self._batch_axis = sharded.batch_axis
        if isinstance(given, keras.distribution.DataParallel):
            self.strategy = given

    def distribute(self, module: Any) -> None:
        """Set a sharded run's layouts for `module` (its `configure_layout`, the "fsdp" rule) before it is built.

        Raises:
            TypeError, ValueError: For a layout that is not one, or names an axis the mesh does not have.
        """
        sharded = self.plan.mesh
        if sharded is None or sharded.strategy == "data_parallel" or self._distributed is module:
            return
        hook = f"{type(module).__name__}.configure_layout(mesh)"
        layouts = layouts_of(layout_map_of(sharded.given), self.device_mesh, "the ModelParallel given")
        layouts.update(layouts_of(module.configure_layout(self.device_mesh), self.device_mesh, hook))
        fsdp = sharded.strategy == "fsdp"
        self.strategy = CheckedLayouts(self.device_mesh, layouts, batch_dim_name=self._batch_axis,
                                       fsdp_axis=self._batch_axis if fsdp else None,
                                       fsdp_min_bytes=sharded.fsdp_min_bytes)
        self._distributed = module

    def check_layouts(self, module: Any) -> None:
        """Refuse layout keys that matched no variable of the built model (a typo would silently replicate).

        Raises:
            ValueError: Naming each key and some of the variables' paths.
        """
        if not isinstance(self.strategy, CheckedLayouts):
            return
        unmatched = self.strategy.unmatched()
        if unmatched:
            paths = [v.path for v in module.model.variables][:6]
            raise ValueError(f"{type(module).__name__}.configure_layout: the layout key(s) {unmatched} match no "
                             f"variable (the regex must match the whole variable.path, e.g. {paths}). Fix or remove "
                             "them; nothing was trained or written.")

    @functools.cached_property
    def replicas(self) -> int:
        """Data-parallel replicas: the devices of every process, or a sharded mesh's batch axis."""
        if self.plan.mesh is not None:
            return self.plan.mesh.data_replicas
        return len(self.plan.jax_devices())

    @property
    def shards_state(self) -> bool:
        """True under "fsdp"/"model_parallel" (a given DataParallel replicates)."""
        return self.plan.mesh is not None and self.plan.mesh.strategy != "data_parallel"

    @property
    def process_index(self) -> int:
        """`jax.process_index()`."""
        return jax.process_index()

    def gather_json(self, value: Any) -> list[Any]:
        """`value` of every process (JSON through `process_allgather` of its bytes, padded to the longest)."""
        if not self.multi_process:
            return [value]
        from jax.experimental import multihost_utils

        data = np.frombuffer(json.dumps(value).encode(), np.uint8)
        lengths = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
        padded = np.zeros(int(lengths.max()), np.uint8)
        padded[:data.size] = data
        rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
        return [json.loads(bytes(row[:length])) for row, length in zip(rows, lengths, strict=True)]

    @functools.cached_property
    def device_count(self) -> int:
        """Devices of every process."""
        return len(self.plan.jax_devices())

    @functools.cached_property
    def _one_device(self) -> Any:
        return self.plan.jax_devices()[0]  # its platform decides how a one-device run's batches are placed

    def strategy_name(self) -> str:
        """"data_parallel" (keras.distribution.DataParallel), "one_device", "fsdp" or "model_parallel", with the
        mesh of a sharded run (e.g. "fsdp, mesh batch=8")."""
        if self.plan.mesh is None:
            return self.plan.strategy
        return f"{self.plan.strategy}, mesh {self.plan.mesh.describe()}"

    def state_bytes(self, module: Any, optimizers: list) -> dict[str, tuple[int, int]] | None:
        """Of a sharded run: {"weights"/"optimizer": (bytes on this process's most loaded device, bytes replicated)},
        read from the arrays' shardings; None for a replicated run."""
        if self.plan.mesh is None or module.model is None:
            return None
        slots = [v for optimizer in optimizers for v in optimizer.variables]
        parts = {"weights": list(module.model.variables), "optimizer": slots}
        return {name: (most_loaded(arrays), replicated_bytes(arrays)) for name, arrays in parts.items()}

    def scope(self) -> contextlib.AbstractContextManager:
        """The distribution's scope: variables created in it are replicated over the devices."""
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def visible_accelerators(self) -> Accelerators:
        """GPUs (compute capability, where JAX reports it) and TPUs."""
        devices = jax.local_devices()
        gpus = tuple(compute_capability(d) for d in devices if d.platform == "gpu")
        return Accelerators(gpus=gpus, tpus=sum(d.platform == "tpu" for d in devices))

    def device_name(self) -> str | None:
        """The first GPU's name (e.g. "NVIDIA H200")."""
        gpus = _local_gpus()
        return gpus[0].device_kind if gpus else None

    def tf32_enabled(self) -> bool:
        """True unless JAX's default matmul precision asks for full float32."""
        return str(jax.config.jax_default_matmul_precision or "default").lower() not in ("highest", "float32")

    # ----- data --------------------------------------------------------------------------------

    def batches(self, source: Any, epoch: int = 0, skip_batches: int = 0, seed: int = 0) -> Iterator[Any]:
        """Numpy global batches of the epoch, placed on the devices by the runner (a stream's one reader,
        `source.reader`)."""
        return source.reader(lambda: source.numpy_batches(epoch, skip_batches, seed))

    def place(self, batch: Any, *, stacked: bool = False) -> Any:
        """Put a global batch (or N stacked ones) on the mesh, split along the batch when it divides evenly."""
        if self.device_count == 1:
            # A CPU takes numpy as it is (its fastest path); an accelerator gets the copy now (to the default
            # device, where the state lives, as a numpy argument would), so a batch read ahead is there in time.
            return batch if self._one_device.platform == "cpu" else jax.device_put(batch)
        processes, index = jax.process_count(), jax.process_index()
        size = keras.tree.flatten(batch)[0].shape[1 if stacked else 0]
        sharding, even = self._batch_sharding(size, stacked)

        def put(array: np.ndarray) -> Any:
            if processes == 1:
                return jax.device_put(array, sharding)
            if self.plan.mesh is not None:  # each process has the whole global batch: each device takes its slice
                return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])
            if not even:
                return jax.make_array_from_process_local_data(sharding, array)
            share = size // processes
            part = array[:, index * share:(index + 1) * share] if stacked else array[index * share:(index + 1) * share]
            return jax.make_array_from_process_local_data(sharding, part, array.shape)

        return keras.tree.map_structure(put, batch)

    # ----- steps -------------------------------------------------------------------------------

    def train_step(self, module: Any, optimizers: list, configured: list, precision: Any, *,
                   gradient_clip_val: float | None, accumulate_grad_batches: int) -> JaxTrainStep:
        """A `JaxTrainStep`: the one optimizer's update, or (manual optimization) each `manual_step`'s."""
        self._step = JaxTrainStep(module, optimizers, configured, precision, gradient_clip_val=gradient_clip_val,
                                  accumulate_grad_batches=accumulate_grad_batches)
        self._stop_requested = False
        self._clock_seconds = 0.0
        return self._step

    def prepare_train_step(self, step: JaxTrainStep, source: Any) -> list[str]:
        """Trace the step abstractly on the first batch's shapes (this builds a subclassed model and finds what
        it logs), then build the optimizer and the state."""
        step.batch_spec = shape_spec(source.first_batch())
        with self.scope(), tracing_scope(step.module):
            logs = jax.eval_shape(lambda b: step.forward(b)[0], step.batch_spec)
            check_float16_lowers_on_cpu(lambda b: step.forward(b)[0], step.batch_spec, self.plan.jax_devices(),
                                        step.precision.compute_dtype, step.precision.name)
        with self.scope():
            step.build()
        self.check_layouts(step.module)
        step.keys = step.output_keys(list(logs))
        return step.keys + ([STOP, CLOCK] if self.multi_process else [])

    def train_runner(self, step: JaxTrainStep, keys: list[str]) -> Runner:
        """Runs the step one batch per call, or N batches per call under `lax.scan`."""
        return TrainRunner(self, step, keys)

    def eval_runner(self, module: Any, source: Any, hook: str, prefix: str) -> Runner:
        """Runs `validation_step`/`test_step` jitted over the current weights."""
        step = EvalStep(module, hook, prefix)
        return EvalRunner(self, module, step, source)

    def predict(self, module: Any, source: Any) -> list[Any]:
        """`predict_step` jitted over the current weights, one numpy structure per global batch."""
        model = module.model
        variables = list(model.variables)

        def predict(values: list, batch: Any, index: Any) -> Any:
            module_runtime(module).stage = "predict"
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))), \
                    traced_batch_index(index):
                return call_step_hook(module, "predict_step", batch)

        compiled = jax.jit(predict)
        values = stateless_values(variables)
        return [keras.tree.map_structure(to_host, compiled(values, self.place(batch), np.int32(index)))
                for index, batch in enumerate(source.numpy_batches(0))]

    def training_flops(self, module: Any, global_batch_size: int) -> float | None:
        """FLOPs of the training step over a global batch: its matrix products and convolutions, counted from
        the step's jaxpr (flops.py says why not from XLA's cost analysis); None before a step exists."""
        step = self._step
        if step is None or step.batch_spec is None:
            return None
        big, small = step.read_state()
        return matmul_flops(step, big, small, self.place_spec(step.batch_spec), jnp.int32(0)) or None

    def peak_memory(self) -> tuple[int | None, str]:
        """The first GPU's allocator peak since the process started (JAX cannot reset it: a run measured alone
        runs in a process of its own, as compare_precision's do), or the process's peak RSS."""
        gpus = _local_gpus()
        stats = gpus[0].memory_stats() if gpus else None
        if stats and "peak_bytes_in_use" in stats:
            return int(stats["peak_bytes_in_use"]), f"{gpus[0].device_kind} allocator peak"
        return super().peak_memory()

    def pinned_outputs(self, step: JaxTrainStep) -> dict[str, Any]:
        """For a sharded run, the jit argument that keeps the state's layouts: each output of the step takes its
        input's sharding (left to XLA, a weight could come back laid out otherwise, and each call would then
        compile again and move it); the outputs vector is replicated. Empty for a replicated run."""
        if self.plan.mesh is None:
            return {}
        big, small = step.read_state()
        keep = jax.tree.map(lambda array: array.sharding, (big, small))
        return {"out_shardings": (*keep, NamedSharding(self._mesh, PartitionSpec()))}

    def place_spec(self, spec: Any) -> Any:
        """Shape specs of a global batch, with the sharding `place` gives it."""
        def sharded(each: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct(each.shape, each.dtype, sharding=self._batch_sharding(each.shape[0])[0])
        return keras.tree.map_structure(sharded, spec)

    def _batch_sharding(self, size: int, stacked: bool = False) -> tuple[NamedSharding, bool]:
        """Split along the batch when `size` divides evenly over the devices, else whole on every device."""
        axis = self._batch_axis if self._batch_axis in self._mesh.axis_names else None
        even = axis is not None and size % self.replicas == 0
        spec = (PartitionSpec(None, axis) if stacked else PartitionSpec(axis)) if even else PartitionSpec()
        return NamedSharding(self._mesh, spec), even

    # ----- state -------------------------------------------------------------------------------

    def sync(self) -> None:
        """Write the live training state into the Keras variables."""
        if self._step is not None:
            self._step.write_big()

    def place_slices(self, variable: Any, saved: Any) -> None:
        """Assign a variable saved sharded: each device of `variable`'s layout gets its region, read from the saved
        slices that overlap it (the whole array is never put together when the variable is sharded too)."""
        sharding = getattr(variable.value, "sharding", None)
        if sharding is None or sharding.is_fully_replicated:
            variable.assign(np.asarray(saved))
            return
        dtype = np.dtype(getattr(variable.dtype, "name", variable.dtype))
        regions = list(sharding.addressable_devices_indices_map(tuple(variable.shape)).values())
        with saved.kept(regions):  # this process's slices read at once, in parallel; each only once
            variable.assign(jax.make_array_from_callback(tuple(variable.shape), sharding,
                                                         lambda index: saved.region(index).astype(dtype, copy=False)))
        if any(device.platform == "cpu" for device in sharding.device_set):
            self._replaced_bytes += int(variable.value.nbytes)
            if self._replaced_bytes >= _TRIM_BYTES:  # the replaced buffers, freed by XLA's threads: else they all
                return_freed_memory()                 # stay resident, and the restore's peak is two states
                self._replaced_bytes = 0

    def host_value(self, variable: Any, array: np.ndarray, give_away: bool = False) -> Any:
        """A value to assign to `variable` from a host array. On a CPU XLA uses an aligned host array's memory in
        place (even when asked not to): an array given away becomes the variable's value through DLPack without
        a copy (a donated step later writes fresh buffers, never into it); any other writable array is copied
        first, so that a later write to it cannot change a weight."""
        devices = list(getattr(getattr(variable.value, "sharding", None), "device_set", ()))
        if not isinstance(array, np.ndarray) or not devices or any(device.platform != "cpu" for device in devices):
            return array  # to an accelerator the transfer is the copy
        if not give_away:
            return np.array(array, copy=True) if array.flags.writeable else array
        if len(devices) == 1:
            try:
                return jax.dlpack.from_dlpack(array, device=devices[0], copy=False)
            except (BufferError, ValueError, TypeError):  # not aligned, read-only, or a dtype DLPack has no code for
                pass
        return array

    def reload(self) -> None:
        """Drop the live state: the next step reads the (just assigned) variables."""
        if self._step is not None:
            self._step.big = None

    def request_stop(self, step: Any) -> None:
        """Give a stop request to the next step's all-process reduction."""
        self._stop_requested = True

    def share_clock(self, step: Any, seconds: float) -> None:
        """Give this process's clock to the next execution's all-process gather (the chief's is kept)."""
        self._clock_seconds = seconds


def _local_gpus() -> list[Any]:
    """This process's GPUs, in JAX's order."""
    return [device for device in jax.local_devices() if device.platform == "gpu"]


def compute_capability(device: Any) -> tuple[int, int]:
    """A GPU's compute capability as (major, minor); (0, 0) where JAX does not report it."""
    capability = getattr(device, "compute_capability", None)
    try:
        major, minor = str(capability).split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return 0, 0
