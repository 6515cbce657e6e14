"""Train one module twice, float32 and a lower precision, and say whether the lower one tracks it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ktrainer.callbacks import Callback
from ktrainer.errors import check_int
from ktrainer.loggers import TensorBoardLogger
from ktrainer.module import Module
from ktrainer.precision import resolve_precision
from ktrainer.strategies.memory import peak_memory, reset_peak_memory
from ktrainer.trainer import Trainer

__all__ = ["compare_precision", "PrecisionComparison"]

BASELINE = "32-true"


@dataclass
class RunRecord:
    """What one of the two runs did."""

    precision: str
    losses: list[float]
    steps_per_sec: float
    skipped_steps: int
    peak_memory: int | None
    memory_measure: str
    log_dir: str | None


@dataclass
class PrecisionComparison:
    """The result of `compare_precision`.

    Attributes:
        precision: The precision compared with float32.
        warmup: Steps left out of the gap and the speed.
        max_relative_gap: Max over steps after warm-up of |loss - loss32| / |loss32|.
        mean_relative_gap: Mean of the same.
        non_finite_steps: Steps whose loss was inf or NaN, in the lower precision.
        skipped_steps: Optimizer steps skipped by loss scaling.
        speed_ratio: Steps/s of the lower precision over float32 (after warm-up).
        verdict: "tracks", "diverges" or "no speedup on this hardware".
        baseline: The float32 run.
        run: The lower-precision run.
        tolerance: The mean relative gap allowed for "tracks".
    """

    precision: str
    warmup: int
    max_relative_gap: float
    mean_relative_gap: float
    non_finite_steps: int
    skipped_steps: int
    speed_ratio: float
    verdict: str
    baseline: RunRecord
    run: RunRecord
    tolerance: float = field(default=0.05)

    def report(self) -> str:
        """A human-readable report, one fact per line."""

        def memory(record: RunRecord) -> str:
            if record.peak_memory is None:
                return record.memory_measure
            return f"{record.peak_memory / 2**20:.0f} MiB ({record.memory_measure})"

        lines = [
            f"compare-precision: {self.precision} against {BASELINE}, {len(self.baseline.losses)} steps, "
            f"warm-up {self.warmup}",
            f"  loss gap after warm-up: max {self.max_relative_gap:.2%}, mean {self.mean_relative_gap:.2%} "
            f"(tolerance {self.tolerance:.0%} mean)",
            f"  final loss: {self.baseline.losses[-1]:.5g} ({BASELINE}) vs {self.run.losses[-1]:.5g} "
            f"({self.precision})",
            f"  non-finite losses: {self.non_finite_steps}; skipped steps: {self.skipped_steps}",
            f"  steps/s: {self.baseline.steps_per_sec:.1f} ({BASELINE}) vs {self.run.steps_per_sec:.1f} "
            f"({self.precision}): {self.speed_ratio:.2f}x",
            f"  peak memory: {memory(self.baseline)} ({BASELINE}) vs {memory(self.run)} ({self.precision})",
            f"  verdict: {self.verdict}",
        ]
        if self.baseline.log_dir:
            root = self.baseline.log_dir.rsplit("/", 2)[0]
            lines.append(f"  curves: tensorboard --logdir {root}")
        return "\n".join(lines)


class _LossTimer(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.times: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, metrics: dict[str, float], batch_idx: int) -> None:
        self.losses.append(metrics["train/loss_step"])
        self.times.append(time.perf_counter())


def _run(make_module: Callable[[], Module], precision: str, steps: int, warmup: int, root: str | None,
         trainer_kwargs: dict[str, Any]) -> RunRecord:
    timer = _LossTimer()
    logger = TensorBoardLogger(save_dir=root, name=precision) if root else False
    trainer = Trainer(precision=precision, max_steps=steps, steps_per_execution=1, log_every_n_steps=1,
                      limit_val_batches=0, logger=logger, callbacks=[timer], enable_checkpointing=False,
                      **trainer_kwargs)
    reset_peak_memory()
    trainer.fit(make_module())
    peak, measure = peak_memory()
    timed = len(timer.times) - 1 - warmup
    speed = timed / (timer.times[-1] - timer.times[warmup]) if timed > 0 else float("nan")
    return RunRecord(precision, timer.losses, speed, trainer.skipped_steps, peak, measure,
                     logger.log_dir if logger else None)


def compare_precision(
    module: type[Module] | Callable[[], Module],
    precision: str = "16-mixed",
    *,
    steps: int = 200,
    warmup: int | None = None,
    tolerance: float = 0.05,
    root: str | None = "runs/compare-precision",
    **trainer_kwargs: Any,
) -> PrecisionComparison:
    """Train the same module on the same data and seed in float32 and in `precision`, and compare.

    Both runs log to TensorBoard under `root` (`{root}/32-true/...`, `{root}/16-mixed/...`), so
    `tensorboard --logdir root` overlays the two loss curves.

    Args:
        module: A Module class (called with no arguments) or a function returning a fresh Module.
        precision: The precision to check against "32-true".
        steps: Optimizer steps per run.
        warmup: Steps left out of the gap and the speed; default 10% of `steps`.
        tolerance: The mean relative loss gap up to which the verdict is "tracks".
        root: Where the TensorBoard logs go; None: no logs.
        **trainer_kwargs: Other Trainer arguments (batch_size, seed (default 0), ...).

    Returns:
        A `PrecisionComparison`; `print(result.report())` shows it.

    Raises:
        ValueError: For an unsupported precision or bad step counts.
    """
    resolve_precision(precision)
    steps = check_int("steps", steps, minimum=2)
    warmup = steps // 10 if warmup is None else check_int("warmup", warmup, minimum=0)
    if warmup >= steps - 1:
        raise ValueError(f"warmup={warmup} leaves nothing to compare in {steps} steps; use warmup < steps - 1.")
    trainer_kwargs.setdefault("seed", 0)
    trainer_kwargs.setdefault("enable_progress_bar", False)
    baseline = _run(module, BASELINE, steps, warmup, root, trainer_kwargs)
    run = _run(module, precision, steps, warmup, root, trainer_kwargs)
    reference = np.asarray(baseline.losses[warmup:], dtype=np.float64)
    lower = np.asarray(run.losses[warmup:], dtype=np.float64)
    both_finite = np.isfinite(reference) & np.isfinite(lower)
    gaps = np.abs(lower - reference)[both_finite] / np.maximum(np.abs(reference[both_finite]), 1e-12)
    max_gap = float(gaps.max()) if gaps.size else math.inf
    mean_gap = float(gaps.mean()) if gaps.size else math.inf
    non_finite = int((~np.isfinite(run.losses)).sum())
    baseline_non_finite = int((~np.isfinite(baseline.losses)).sum())
    ratio = run.steps_per_sec / baseline.steps_per_sec
    if non_finite > baseline_non_finite or mean_gap > tolerance:
        verdict = "diverges"
    elif not ratio > 1.0:
        verdict = "no speedup on this hardware"
    else:
        verdict = "tracks"
    return PrecisionComparison(precision, warmup, max_gap, mean_gap, non_finite, run.skipped_steps, ratio, verdict,
                               baseline, run, tolerance)
