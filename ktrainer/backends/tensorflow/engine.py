"""The TensorFlow engine: a tf.distribute strategy, `tf.function` steps over distributed datasets."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ktrainer.backends.accelerators import Accelerators
from ktrainer.backends.engine import Engine, Runner
from ktrainer.backends.tensorflow import flops, hardware, memory
from ktrainer.backends.tensorflow.feed import element_spec, epoch_dataset
from ktrainer.backends.tensorflow.steps import CompiledSteps, compile_predict_step, discover_outputs
from ktrainer.backends.tensorflow.train_step import TrainStep
from ktrainer.step.outputs import EvalStep

__all__ = ["TensorFlowEngine"]


class TensorFlowEngine(Engine):
    """Runs steps under the plan's tf.distribute strategy (made at `start`)."""

    name = "tensorflow"

    def __init__(self, plan: Any) -> None:
        super().__init__(plan)
        self.strategy: tf.distribute.Strategy | None = None

    def start(self) -> None:
        """Make the plan's strategy (once per Trainer)."""
        if self.strategy is None:
            self.strategy = self.plan.make_strategy()

    @property
    def replicas(self) -> int:
        """Replicas in sync (1 before `start`)."""
        return self.strategy.num_replicas_in_sync if self.strategy is not None else 1

    @property
    def multi_process(self) -> bool:
        """True under MultiWorkerMirroredStrategy."""
        return self.plan.strategy == "multi_worker"

    def scope(self) -> contextlib.AbstractContextManager:
        """The strategy's scope."""
        return self.strategy.scope()

    def visible_accelerators(self) -> Accelerators:
        """GPUs and TPUs TensorFlow sees."""
        return hardware.visible_accelerators()

    def device_name(self) -> str | None:
        """The first GPU's name."""
        return flops.gpu_name()

    def tf32_enabled(self) -> bool:
        """TensorFlow's TensorFloat-32 setting."""
        return flops.tf32_enabled()

    def train_step(self, module: Any, optimizers: list, configured: list, precision: Any, *,
                   gradient_clip_val: float | None, accumulate_grad_batches: int) -> TrainStep:
        """A `TrainStep`; with several workers it carries the stop flag and the chief's clock they agree on."""
        shared = [tf.Variable(0.0, trainable=False) for _ in range(2)] if self.multi_process else [None, None]
        return TrainStep(module, optimizers, configured, precision, self.strategy,
                         gradient_clip_val=gradient_clip_val, accumulate_grad_batches=accumulate_grad_batches,
                         stop_flag=shared[0], clock=shared[1])

    def prepare_train_step(self, step: TrainStep, source: Any) -> list[str]:
        """Trace `step.forward` on the data's spec (inside the scope), then build the step's variables."""
        with self.strategy.scope():
            keys = discover_outputs(step.forward, element_spec(source))
            step.build()
        return keys

    def train_runner(self, step: TrainStep, keys: list[str]) -> Runner:
        """`CompiledSteps` of the training step."""
        return CompiledSteps(step, self.strategy, keys)

    def eval_runner(self, module: Any, source: Any, hook: str, prefix: str) -> Runner:
        """`CompiledSteps` of an `EvalStep` (traced here, which builds a subclassed model)."""
        step = EvalStep(module, hook, prefix)
        return CompiledSteps(step, self.strategy, discover_outputs(step, element_spec(source)))

    def batches(self, source: Any, epoch: int = 0, skip_batches: int = 0, seed: int = 0) -> Iterator[Any]:
        """The strategy's distributed iterator over the epoch's tf.data.Dataset (a stream's one, `source.reader`)."""
        distribute = self.strategy.experimental_distribute_dataset
        return source.reader(lambda: iter(distribute(epoch_dataset(source, epoch, skip_batches, seed))))

    def predict(self, module: Any, source: Any) -> list[Any]:
        """The compiled predict step over every global batch."""
        step = compile_predict_step(module, self.strategy)
        dataset = self.strategy.experimental_distribute_dataset(epoch_dataset(source))
        return [keras.tree.map_structure(np.asarray, step(batch, tf.constant(index, tf.int64)))
                for index, batch in enumerate(dataset)]

    def training_flops(self, module: Any, global_batch_size: int) -> float | None:
        """Counted statically from the traced forward graph (x3 for the backward pass)."""
        return flops.training_flops(module.model, global_batch_size)

    def reset_peak_memory(self) -> None:
        """Reset the first GPU's allocator statistics, or the process's high-water mark."""
        memory.reset_peak_memory()

    def peak_memory(self) -> tuple[int | None, str]:
        """The first GPU's allocator peak, or the process's peak RSS."""
        return memory.peak_memory()

    def host_value(self, variable: Any, array: np.ndarray, give_away: bool = False) -> Any:
        """A value to assign to `variable` from a host array: an array given away, of the variable's dtype, as a
        tensor that uses its memory (DLPack), which the assign then takes as the variable's buffer on a CPU;
        otherwise the array itself, which TensorFlow copies (twice: `tf.constant` first copies a numpy array)."""
        if not give_away or not isinstance(array, np.ndarray) or array.dtype.name != variable.dtype:
            return array
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except (BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):  # read-only, or no DLPack code
            return array

    def request_stop(self, step: TrainStep) -> None:
        """Set this worker's stop flag: every worker reads the sum in the next execution's all-reduce."""
        if step.stop_flag is not None:
            step.stop_flag.assign(1.0)

    def share_clock(self, step: TrainStep, seconds: float) -> None:
        """The chief sets its clock for the next execution's all-reduce (the other workers' stays 0)."""
        if step.clock is not None and self.plan.is_chief:
            step.clock.assign(seconds)
