"""Training throughput and model FLOPs utilisation (MFU), logged under `perf/`."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ktrainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["ThroughputMonitor", "peak_flops_per_device"]

log = logging.getLogger(__name__)

# Dense peak FLOP/s (no structured sparsity) from NVIDIA's datasheets, by the number format the
# matrix units run in. The first pattern that matches the device name wins, so "H100 PCIe" comes
# before the SXM "H100"; word boundaries keep "L4" from matching "L40S".
_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"\bH100 PCIe\b", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    (r"\bH100\b", {"bf16": 989e12, "fp16": 989e12, "tf32": 495e12, "fp32": 67e12}),
    (r"\bH200\b", {"bf16": 989e12, "fp16": 989e12, "tf32": 495e12, "fp32": 67e12}),
    (r"\bA100\b", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (r"\bV100\b", {"fp16": 125e12, "fp32": 15.7e12}),
    (r"\bL4\b", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    (r"\bT4\b", {"fp16": 65e12, "fp32": 8.1e12}),
)


# ----- peak FLOP/s ------------------------------------------------------------------------------


def peak_flops_per_device(device_name: str, precision: str, tf32: bool = True) -> float | None:
    """The datasheet peak FLOP/s of one accelerator in a precision, or None when the table does not know it.

    Args:
        device_name: The GPU's name as TensorFlow reports it (e.g. "NVIDIA A100-SXM4-80GB").
        precision: The Trainer's precision name ("32-true", "16-mixed", "bf16-mixed", ...).
        tf32: Whether float32 matrix multiplications run in TF32 (TensorFlow's default on GPUs that have it).
    """
    kind = precision.split("-")[0]
    formats = {"16": ("fp16",), "bf16": ("bf16",), "32": ("tf32", "fp32") if tf32 else ("fp32",)}.get(kind, ())
    for pattern, peaks in _PEAKS:
        if re.search(pattern, device_name):
            return next((peaks[f] for f in formats if f in peaks), None)
    return None


def _device_peak(trainer: Trainer) -> float | None:
    if trainer.plan.accelerator != "gpu":
        return None
    name, tf32 = trainer.engine.device_name(), trainer.engine.tf32_enabled()
    return None if name is None else peak_flops_per_device(name, trainer.precision.name, tf32)


@dataclass
class _Tally:
    """Batches, optimizer steps and seconds of training measured over an interval."""

    batches: int = 0
    steps: int = 0
    seconds: float = 0.0


class ThroughputMonitor(Callback):
    """Logs training throughput, and model FLOPs utilisation (MFU) where it can, under `perf/`.

    At each of the Trainer's log steps (every `log_every_n_steps` optimizer steps), over the time
    since the previous one:

    - `perf/batches_per_sec`: training batches (calls of `training_step`) per second;
    - `perf/samples_per_sec`: batches x the global batch size (a smaller last batch counts as full);
    - `perf/steps_per_sec`: optimizer steps per second, only with `accumulate_grad_batches` > 1;
    - `perf/flops_per_sec`: `flops_per_step` x batches per second, when the FLOPs are known;
    - `perf/mfu`: flops per second / (peak FLOP/s per device x devices), when the peak is known too.

    At each epoch end the same values over the epoch, named with `_epoch` (`perf/samples_per_sec_epoch`).
    The Trainer adds one when it has a logger and none was given.

    Time is wall time (`time.perf_counter`) read in `on_train_batch_end`, which runs after the loop
    fetched an execution's results: it adds no device synchronisation. Counted: from one execution's
    end to the next one's end, the loop's and callbacks' own work included (a checkpoint saved every
    N steps too). Not counted: the first execution of each `fit` (it traces and compiles the step),
    validation, and the time from an epoch's last execution to the next epoch's first (epoch-end
    hooks and checkpoints). With `steps_per_execution` > 1, values are logged once per execution, at
    the last log step it passed.

    FLOPs per step: `flops_per_step` when given, else counted once per `fit` by the backend (`Engine.training_flops`),
    but only when a peak is known, since then MFU needs it. TensorFlow counts 3 x the forward FLOPs of
    `module.model` on one global batch, read from its traced graph, so a training step that is not one
    forward and backward pass of `module.model` (several views, a GAN) should give its own there. JAX
    counts the matrix products and convolutions of the whole training step from its jaxpr, however many
    models it calls (the first layer's input gradient is never computed, so not counted; nor are fused
    kernels that are not matrix products or convolutions, such as cuDNN attention). Peak: `peak_flops_per_device`
    when given, else looked up by GPU name and the Trainer's precision (A100, H100, H200, V100, L4, T4;
    TF32 for float32 where TensorFlow enables it). On CPUs and other devices the peak is unknown, and
    there is no MFU (nor measured FLOPs); nothing is warned.

    Args:
        flops_per_step: FLOPs of the training step of one global batch: forward and backward, all
            replicas together (with `accumulate_grad_batches`, an optimizer step is several of
            these). None: counted, when a peak is known.
        peak_flops_per_device: Peak FLOP/s of one device in the run's precision. None: from the table.

    Raises:
        ValueError: If `flops_per_step` or `peak_flops_per_device` is not a positive number.
    """

    def __init__(self, flops_per_step: float | None = None, peak_flops_per_device: float | None = None) -> None:
        self.flops_per_step = _positive_or_none("flops_per_step", flops_per_step)
        self.peak_flops_per_device = _positive_or_none("peak_flops_per_device", peak_flops_per_device)
        self._flops: float | None = None
        self._peak: float | None = None  # of all devices together
        self._reset_clock()

    def _reset_clock(self) -> None:
        self._compiled = False
        self._running_since: float | None = None
        self._since_log, self._epoch = _Tally(), _Tally()
        self._first_batch, self._steps_before = 0, 0

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        """Find the peak and the FLOPs per step of this run; restart the clock."""
        self._reset_clock()
        peak = self.peak_flops_per_device if self.peak_flops_per_device is not None else _device_peak(trainer)
        # Every device computes, also those that split one replica's model between them.
        self._peak = None if peak is None else peak * trainer.engine.device_count
        self._flops = self.flops_per_step
        if self._flops is None and self._peak is not None:
            self._flops = trainer.engine.training_flops(module, trainer.global_batch_size)
            if self._flops is None:
                log.info("ThroughputMonitor could not count the model's FLOPs (e.g. a subclassed model on "
                         "TensorFlow); give ThroughputMonitor(flops_per_step=...) to log perf/mfu.")

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Start the epoch's tally."""
        self._epoch = _Tally()

    def on_train_batch_start(self, trainer: Trainer, module: Module, batch_idx: int) -> None:
        """Note where the execution starts; resume the clock after a pause."""
        self._first_batch, self._steps_before = batch_idx, trainer.global_step
        if self._compiled and self._running_since is None:
            self._running_since = perf_counter()

    def on_train_batch_end(self, trainer: Trainer, module: Module, metrics: dict[str, float], batch_idx: int) -> None:
        """Count the execution (after the first), and log at the log steps it passed."""
        now = perf_counter()
        if not self._compiled:
            self._compiled, self._running_since = True, now
            return
        seconds = now - self._running_since
        for tally in (self._since_log, self._epoch):
            tally.batches += batch_idx + 1 - self._first_batch
            tally.steps += trainer.global_step - self._steps_before
            tally.seconds += seconds
        self._running_since = now
        every = trainer.log_every_n_steps
        if trainer.global_step // every > self._steps_before // every:
            self._log(trainer, self._since_log, trainer.global_step // every * every, "")
            self._since_log = _Tally()

    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        """Stop the clock until the next execution: validation is not training time."""
        self._running_since = None

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Stop the clock until the next epoch's first execution, and log the epoch's values."""
        self._running_since = None
        self._log(trainer, self._epoch, None, "_epoch")

    def _log(self, trainer: Trainer, tally: _Tally, step: int | None, suffix: str) -> None:
        if tally.batches == 0 or tally.seconds <= 0:
            return
        values = self._rates(tally, trainer.global_batch_size, trainer.accumulate_grad_batches > 1)
        trainer.log_metrics({f"{name}{suffix}": value for name, value in values.items()}, step)

    def _rates(self, tally: _Tally, global_batch_size: int, accumulating: bool) -> dict[str, float]:
        batches_per_sec = tally.batches / tally.seconds
        values = {"perf/batches_per_sec": batches_per_sec, "perf/samples_per_sec": batches_per_sec * global_batch_size}
        if accumulating:
            values["perf/steps_per_sec"] = tally.steps / tally.seconds
        if self._flops is not None:
            values["perf/flops_per_sec"] = self._flops * batches_per_sec
            if self._peak is not None:
                values["perf/mfu"] = values["perf/flops_per_sec"] / self._peak
        return values


def _positive_or_none(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number or None, got {value!r}.")
    return float(value)
