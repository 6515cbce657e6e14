"""JAX: the runners of the compiled calls: training (one batch per call, or N under `lax.scan`, dispatched ahead)
and evaluation, and the reads of their outputs to the host."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from ktrainer.backends.engine import InFlight, Runner
from ktrainer.backends.jax.read_ahead import ReadAhead
from ktrainer.backends.jax.train_step import JaxTrainStep, current_values, stateless_values, tracing_scope
from ktrainer.step.hooks import traced_batch_index
from ktrainer.step.metrics import metric_objects
from ktrainer.step.outputs import CLOCK, STOP, EvalStep

if TYPE_CHECKING:
    from ktrainer.backends.jax.engine import JaxEngine

__all__ = ["TrainRunner", "EvalRunner", "shape_spec", "to_host", "start_to_host"]


def shape_spec(batch: Any) -> Any:
    """The shapes and dtypes of a numpy batch, as a jax.eval_shape argument."""
    return keras.tree.map_structure(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch)


def to_host(array: Any) -> np.ndarray:
    """A (replicated) global array as a numpy array, also when other processes hold part of its devices."""
    return np.asarray(_local(array))


def start_to_host(array: Any) -> None:
    """Start copying what `to_host` will read to the host, without waiting for the array."""
    _local(array).copy_to_host_async()


def _local(array: Any) -> Any:
    return array if getattr(array, "is_fully_addressable", True) else array.addressable_data(0)


class TrainRunner(Runner):
    """The training step, jitted with the state donated: one batch per call, or N under `lax.scan`. While the
    device runs a call, the next call's batches are read and placed (read_ahead.py)."""

    dispatches_ahead = True

    def __init__(self, engine: JaxEngine, step: JaxTrainStep, keys: list[str]) -> None:
        self.engine = engine
        self.step = step
        self.keys = keys
        pinned = engine.pinned_outputs(step)
        self._single = jax.jit(step, donate_argnums=0, **pinned)
        self._scanned = jax.jit(self._scan, donate_argnums=0, **pinned)
        self._ahead = ReadAhead(self._prepare)
        self._live_small: tuple | None = None
        self._in_flight = 0

    def _scan(self, big: tuple, small: tuple, batches: Any, first_index: Any) -> tuple[tuple, tuple, Any]:
        def body(carry: tuple, inputs: tuple) -> tuple[tuple, Any]:
            (big, small), (batch, index) = carry, inputs
            big, small, vector = self.step(big, small, batch, index)
            return (big, small), vector

        count = keras.tree.flatten(batches)[0].shape[0]
        (big, small), vectors = jax.lax.scan(body, (big, small), (batches, first_index + jnp.arange(count)))
        return big, small, vectors

    def _prepare(self, batches: list[Any]) -> tuple[bool, Any]:
        """(scanned, placed): N batches of one shape stacked for the scan, else each on its own."""
        shapes = {tuple(np.shape(a) for a in keras.tree.flatten(b)) for b in batches}
        if len(batches) > 1 and len(shapes) == 1:
            stacked = keras.tree.map_structure(lambda *parts: np.stack(parts), *batches)
            return True, self.engine.place(stacked, stacked=True)
        return False, [self.engine.place(batch) for batch in batches]

    def run(self, iterator: Iterator[Any], num_steps: int, first_index: int = 0, *,
            ahead: int = 0) -> dict[str, np.ndarray]:
        """Run up to `num_steps` batches, reading the next call's `ahead` meanwhile; returns every step's values."""
        return self.dispatch(iterator, num_steps, first_index, ahead=ahead).result()

    def dispatch(self, iterator: Iterator[Any], num_steps: int, first_index: int = 0, *,
                 ahead: int = 0) -> InFlight:
        """Dispatch up to `num_steps` batches and return at once (the device runs on): the outputs' copy to the
        host is started, the next call's `ahead` batches are read, and the next call may be dispatched before
        this one is read. Each call's small state (loss scales, metric values) reaches the variables when its
        outputs are read, so the loop accounting a call sees that call's metric values."""
        batches, prepared = self._ahead.take(iterator, num_steps)
        if not batches:
            return InFlight.done({key: np.zeros((0,), np.float32) for key in self.keys})
        scanned, placed = prepared
        big, small = self.step.read_state()
        if self._live_small is not None:  # the newest call in flight's, not yet in the variables
            small = self._live_small
        if scanned:
            big, small, stacked = self._scanned(big, small, placed, np.int32(first_index))
            rows = [stacked]
        else:
            rows = []
            for offset, batch in enumerate(placed):
                big, small, row = self._single(big, small, batch, np.int32(first_index + offset))
                rows.append(row)
        self.step.big = big
        self._live_small = small
        self._in_flight += 1
        for row in rows:
            start_to_host(row)
        self._ahead.read(iterator, ahead)  # the host's work for the next call, while the device runs this one
        clock = self.engine._clock_seconds

        def read() -> dict[str, np.ndarray]:
            values = to_host(rows[0]) if scanned else np.stack([to_host(row) for row in rows])  # no extra dispatch
            self._in_flight -= 1
            self.step.write_small(small)
            if self._in_flight == 0:
                self._live_small = None
            outputs = dict(zip(self.step.keys, values.T, strict=True))
            if self.engine.multi_process:
                outputs.update(self._agreed_values(len(batches), clock))
            return outputs

        return InFlight(read)

    def _agreed_values(self, count: int, clock: float) -> dict[str, np.ndarray]:
        """Whether any process asked to stop, and the chief's clock: the same answers in every process."""
        from jax.experimental import multihost_utils

        mine = np.array([float(self.engine._stop_requested), clock], np.float32)
        votes = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)  # one row per process
        return {STOP: np.full((count,), float(votes[:, 0].max()), np.float32),
                CLOCK: np.full((count,), float(votes[0, 1]), np.float32)}


class EvalRunner(Runner):
    """`validation_step`/`test_step` jitted over the weights of the variables (synced before an evaluation)."""

    def __init__(self, engine: JaxEngine, module: Any, step: EvalStep, source: Any) -> None:
        self.engine = engine
        self.module = module
        self.step = step
        model = module.model
        spec = shape_spec(source.first_batch())
        # Traced abstractly once: this builds a subclassed model evaluated before training, and gives the keys.
        with engine.scope(), tracing_scope(module):
            self.keys = list(jax.eval_shape(step, spec))
        self.variables = list(model.trainable_variables) + list(model.non_trainable_variables)
        self.metric_variables = [v for metric in metric_objects(module, step.prefix).values()
                                 for v in metric.variables]
        self._compiled = jax.jit(self._step)

    def _step(self, values: list, metric_values: list, batch: Any, index: Any) -> tuple[list, Any]:
        mapping = [*zip(self.variables, values, strict=True), *zip(self.metric_variables, metric_values, strict=True)]
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope, traced_batch_index(index):
            outputs = self.step(batch)
            metrics = current_values(scope, self.metric_variables, metric_values)
        return metrics, jnp.stack([jnp.asarray(outputs[key], jnp.float32) for key in self.keys])

    def run(self, iterator: Iterator[Any], num_steps: int, first_index: int = 0, *,
            ahead: int = 0) -> dict[str, np.ndarray]:
        """Run up to `num_steps` batches (`ahead` is unused: evaluation reads no batch ahead); every step's values."""
        values = stateless_values(self.variables)
        metric_values = stateless_values(self.metric_variables)
        rows = []
        for offset, batch in zip(range(num_steps), iterator, strict=False):
            metric_values, vector = self._compiled(values, metric_values, self.engine.place(batch),
                                                   np.int32(first_index + offset))
            rows.append(to_host(vector))
        for variable, value in zip(self.metric_variables, metric_values, strict=True):
            variable.assign(value)
        if not rows:
            return {key: np.zeros((0,), np.float32) for key in self.keys}
        return dict(zip(self.keys, np.stack(rows).T, strict=True))
