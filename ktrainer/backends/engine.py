"""The interface every backend implements; the Trainer calls nothing backend-specific but these."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ktrainer.backends.accelerators import Accelerators
from ktrainer.utils.memory import process_peak, reset_process_peak

__all__ = ["Engine", "InFlight", "Runner"]


class InFlight:
    """A dispatched execution whose outputs have not been read yet.

    Args:
        read: Waits for the execution and returns its outputs (as `Runner.run` returns them); called once.
    """

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read: Callable[[], dict[str, Any]] | None = read
        self._outputs: dict[str, Any] | None = None

    @classmethod
    def done(cls, outputs: dict[str, Any]) -> InFlight:
        """An execution whose outputs are already on the host."""
        return cls(lambda: outputs)

    def result(self) -> dict[str, Any]:
        """The execution's outputs, waiting for them the first time."""
        if self._read is not None:
            self._outputs, self._read = self._read(), None
        return self._outputs


class Runner:
    """Runs a compiled step over up to N batches per call.

    `run` returns each output key's per-step values (numpy arrays of equal length; empty when the
    iterator was already exhausted), so logging stays per step whatever N is. `dispatch` starts a
    call and returns before its outputs are read, where the engine can (the loop then dispatches the
    next call first); calls are read back in the order they were dispatched.

    Attributes:
        dispatches_ahead: Whether `dispatch` returns before the call's outputs are read (else a window of
            calls in flight would change nothing but the order of hooks).
    """

    dispatches_ahead = False

    def run(self, iterator: Iterator[Any], num_steps: int, first_index: int = 0, *, ahead: int = 0) -> dict[str, Any]:
        """Run up to `num_steps` batches from `iterator` (fewer when it ends); `first_index` is the first
        batch's index in its epoch (the hooks' `batch_idx`); `ahead`: the most batches the next call may
        take, which a runner may read while this one runs (0: none)."""
        raise NotImplementedError

    def dispatch(self, iterator: Iterator[Any], num_steps: int, first_index: int = 0, *,
                 ahead: int = 0) -> InFlight:
        """Start `run`'s call and return it in flight (here: run to the end; an engine that dispatches
        asynchronously returns before the outputs are read)."""
        return InFlight.done(self.run(iterator, num_steps, first_index, ahead=ahead))


class Engine:
    """One backend's way of running a Module: devices and variable placement, compiled steps, data, state.

    Attributes:
        name: The Keras backend ("tensorflow" or "jax").
        plan: The device plan it runs (from `ktrainer.backends.plan_devices`).
    """

    name = ""

    def __init__(self, plan: Any) -> None:
        self.plan = plan

    # ----- devices ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the device context (strategy, distribution), once, before anything is built."""

    @property
    def replicas(self) -> int:
        """Replicas a global batch is split over (all processes together)."""
        raise NotImplementedError

    @property
    def shards_state(self) -> bool:
        """True when the variables are split over the devices (each process then saves its own slices)."""
        return False

    @property
    def process_index(self) -> int:
        """This process's number among those training together (0: the chief)."""
        return 0

    def gather_json(self, value: Any) -> list[Any]:
        """`value` (JSON-able) of every process, in process order: an all-process collective (each calls it)."""
        return [value]

    @property
    def device_count(self) -> int:
        """Devices of every process (more than `replicas` where a mesh splits each replica's model)."""
        return self.replicas

    @property
    def multi_process(self) -> bool:
        """True when several processes train together (they must agree on when to stop)."""
        return self.plan.num_nodes > 1

    def scope(self) -> contextlib.AbstractContextManager:
        """Where the model and optimizer variables are created (placed on the devices)."""
        return contextlib.nullcontext()

    def strategy_name(self) -> str:
        """How the devices are used, for the fit summary (e.g. "mirrored", "data_parallel")."""
        return self.plan.strategy

    def distribute(self, module: Any) -> None:
        """Set how `module`'s variables are laid out over the devices, before it is built (a sharded run's
        `configure_layout`); nothing where every device holds all of them."""

    def state_bytes(self, module: Any, optimizers: list) -> dict[str, tuple[int, int]] | None:
        """Of a sharded run: {"weights"/"optimizer": (bytes on the most loaded device, bytes replicated)}; None
        where every device holds the whole state."""
        return None

    def visible_accelerators(self) -> Accelerators:
        """The GPUs (compute capability) and TPUs this process sees."""
        return Accelerators()

    def device_name(self) -> str | None:
        """The name of the first GPU, for its peak FLOP/s; None elsewhere."""
        return None

    def tf32_enabled(self) -> bool:
        """Whether float32 matrix products run in TensorFloat-32 on a GPU."""
        return False

    # ----- steps -----------------------------------------------------------------------------------

    def train_step(self, module: Any, optimizers: list, configured: list, precision: Any, *,
                   gradient_clip_val: float | None, accumulate_grad_batches: int) -> Any:
        """The training step of this backend (see its `TrainStep`): state, accumulation, loss scaling."""
        raise NotImplementedError

    def prepare_train_step(self, step: Any, source: Any) -> list[str]:
        """Trace the training step once (building a subclassed model, finding its output keys), build the
        optimizer and the step's state; returns the output keys."""
        raise NotImplementedError

    def train_runner(self, step: Any, keys: list[str]) -> Runner:
        """A runner of the training step."""
        raise NotImplementedError

    def eval_runner(self, module: Any, source: Any, hook: str, prefix: str) -> Runner:
        """A runner of `validation_step` or `test_step` (traced once here)."""
        raise NotImplementedError

    def batches(self, source: Any, epoch: int = 0, skip_batches: int = 0, seed: int = 0) -> Iterator[Any]:
        """An iterator over one epoch of `source`'s global batches, fed to this backend's devices."""
        raise NotImplementedError

    def predict(self, module: Any, source: Any) -> list[Any]:
        """`module.predict_step` over the source, one numpy structure per global batch."""
        raise NotImplementedError

    def training_flops(self, module: Any, global_batch_size: int) -> float | None:
        """FLOPs of one training step over a global batch; None when they cannot be counted."""
        return None

    def reset_peak_memory(self) -> None:
        """Start measuring a new memory peak (`peak_memory`)."""
        reset_process_peak()

    def peak_memory(self) -> tuple[int | None, str]:
        """The peak memory since `reset_peak_memory`, in bytes (None where unavailable), and what was measured:
        the first accelerator's allocator where the engine can read it, else the process's peak RSS."""
        return process_peak()

    # ----- state -----------------------------------------------------------------------------------

    def sync(self) -> None:
        """Make the Keras variables hold the training state (where a compiled step keeps its own copy)."""

    def place_slices(self, variable: Any, saved: Any) -> None:
        """Assign a variable saved sharded (`checkpoint.slices.SavedSlices`) to `variable`: here put together whole;
        an engine with sharded variables reads each device's region alone."""
        variable.assign(np.asarray(saved))

    def host_value(self, variable: Any, array: np.ndarray, give_away: bool = False) -> Any:
        """A value to assign to `variable` from a host array. `give_away`: nothing will read or write the array
        again (a resume's own read), so the variable may use its memory in place. Here the array itself: the
        assign copies it."""
        return array

    def reload(self) -> None:
        """Take the training state from the Keras variables again (after they were assigned: a resume, EMA)."""

    def request_stop(self, step: Any) -> None:
        """Tell the other processes, through the next step, that this one wants to stop (preemption)."""

    def share_clock(self, step: Any, seconds: float) -> None:
        """Several processes: give this process's clock (seconds since the fit started) to the next execution,
        which returns the chief's to every process as `CLOCK` (run_clock.py)."""

