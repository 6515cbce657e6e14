"""Train one module twice, float32 and a lower precision, and say whether the lower one tracks it.

Each run trains in a process of its own, so each one's peak memory is its own.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import multiprocessing
import pickle
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ktrainer.callbacks import Callback
from ktrainer.checks import check_bool, check_int
from ktrainer.loggers import TensorBoardLogger
from ktrainer.module import Module
from ktrainer.precision import resolve_precision
from ktrainer.trainer.trainer import Trainer
from ktrainer.utils.fs import Location

__all__ = ["compare_precision", "PrecisionComparison"]

BASELINE = "32-true"
PLOT_HINT = "pip install ktrainer[plot] adds a PNG of the two loss curves"

log = logging.getLogger("ktrainer")


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
        plot: Where the PNG of both loss curves was written; None without a `root` or matplotlib.
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
    plot: str | None = None

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
            lines.append(f"  plot: {self.plot or PLOT_HINT}")
        return "\n".join(lines)

    def save_plot(self, root: str, storage_options: dict[str, Any] | None = None) -> str | None:
        """Write a PNG of both loss curves (x: step, a line per precision) under `root`, a path or fsspec URL.

        Returns:
            The PNG's path or URL, also kept as `plot`; None when matplotlib is not installed
            (`pip install ktrainer[plot]`).
        """
        png = _loss_plot_png(self.baseline, self.run, self.warmup)
        if png is None:
            return None
        location = Location(root, dict(storage_options or {}))
        name = f"loss-{BASELINE}-vs-{self.precision}.png"
        location.write_bytes(name, png)
        self.plot = location.join(name).url
        return self.plot


def _loss_plot_png(baseline: RunRecord, run: RunRecord, warmup: int) -> bytes | None:
    try:  # imported here: matplotlib is optional, and its Agg canvas leaves the user's pyplot backend alone
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for record, style in ((baseline, {"linewidth": 2.6, "alpha": 0.5}), (run, {"linewidth": 1.2})):
        losses = np.asarray(record.losses, dtype=np.float64)
        losses[~np.isfinite(losses)] = np.nan  # a gap in the line where the loss was inf or NaN
        axes.plot(np.arange(1, len(losses) + 1), losses, label=record.precision, **style)  # wide under narrow
    if warmup:
        axes.axvline(warmup + 0.5, color="grey", linestyle=":", linewidth=1, label="end of warm-up")
    axes.set(xlabel="step", ylabel="training loss", title=f"compare-precision: {run.precision} against {BASELINE}")
    axes.grid(alpha=0.3)
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


class _LossTimer(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.times: list[float] = []

    def on_train_batch_end(self, trainer: Trainer, module: Module, metrics: dict[str, float], batch_idx: int) -> None:
        self.losses.append(metrics["train/loss_step"])
        self.times.append(time.perf_counter())


def _run(make_module: Callable[[], Module], precision: str, steps: int, warmup: int, root: str | None,
         trainer_kwargs: dict[str, Any]) -> RunRecord:
    """One run, in this process; its peak memory is this process's since the run started."""
    timer = _LossTimer()
    logger = TensorBoardLogger(save_dir=root, name=precision) if root else False
    trainer = Trainer(precision=precision, max_steps=steps, steps_per_execution=1, log_every_n_steps=1,
                      limit_val_batches=0, logger=logger, callbacks=[timer], enable_checkpointing=False,
                      **trainer_kwargs)
    trainer.engine.reset_peak_memory()
    trainer.fit(make_module())
    peak, measure = trainer.engine.peak_memory()
    timed = len(timer.times) - 1 - warmup
    speed = timed / (timer.times[-1] - timer.times[warmup]) if timed > 0 else float("nan")
    return RunRecord(precision, timer.losses, speed, trainer.skipped_steps, peak, measure,
                     logger.log_dir if logger else None)


class _CannotIsolate(Exception):
    """The module factory or the Trainer arguments cannot be run in a process of their own."""


def _run_in_child(connection: Any, payload: bytes, precision: str, steps: int, warmup: int,
                  root: str | None) -> None:
    """A child process's side of `_run_isolated`: load what the parent sent, run, send the record or the error."""
    try:
        make_module, trainer_kwargs = pickle.loads(payload)
    except Exception as error:
        connection.send(("unloadable", f"{type(error).__name__}: {error}"))
        return
    connection.send(("started", None))
    try:
        record = _run(make_module, precision, steps, warmup, root, trainer_kwargs)
    except BaseException as error:  # the parent raises it, with this traceback
        connection.send(("failed", _sendable(error), traceback.format_exc()))
        return
    measure = record.memory_measure.replace("process peak RSS", "peak RSS") + " of its own process"
    connection.send(("done", dataclasses.replace(record, memory_measure=measure)))


def _sendable(error: BaseException) -> BaseException:
    try:
        return pickle.loads(pickle.dumps(error))
    except Exception:  # an exception that does not survive pickling arrives as its text
        return RuntimeError(f"{type(error).__name__}: {error}")


def _pickled(value: Any) -> bytes:
    try:  # optional: it also sends lambdas, closures and what a notebook or script defines, by value
        import cloudpickle as pickler
    except ImportError:
        pickler = pickle
    try:
        return pickler.dumps(value)
    except Exception as error:
        raise _CannotIsolate(f"{type(error).__name__}: {error}") from None


def _run_isolated(make_module: Callable[[], Module], precision: str, steps: int, warmup: int, root: str | None,
                  trainer_kwargs: dict[str, Any]) -> RunRecord:
    """One run in a fresh ("spawn") process: its peak memory is that process's alone.

    Raises:
        _CannotIsolate: When the module factory or the Trainer arguments cannot reach the process.
    """
    payload = _pickled((make_module, trainer_kwargs))
    context = multiprocessing.get_context("spawn")  # a fork would start from this process's memory (and TF state)
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_run_in_child, args=(sender, payload, precision, steps, warmup, root),
                              name=f"compare-precision-{precision}")
    process.start()
    sender.close()
    try:
        return _receive(receiver, process, precision)
    finally:
        receiver.close()
        process.join(timeout=30)  # once it has answered, the process only exits
        if process.is_alive():
            process.terminate()
            process.join()


def _receive(receiver: Any, process: Any, precision: str) -> RunRecord:
    started = False
    while True:
        try:
            kind, *content = receiver.recv()
        except EOFError:
            process.join()
            if not started:
                raise _CannotIsolate(f"its process exited with status {process.exitcode} before running "
                                     "(the error is above)") from None
            raise RuntimeError(f"The {precision} run's process ended with status {process.exitcode} and no "
                               "result (killed, e.g. out of memory?).") from None
        if kind == "unloadable":
            raise _CannotIsolate(f"its process could not load the module: {content[0]}")
        if kind == "failed":
            error, child_traceback = content
            error.add_note(f"In the {precision} run's process:\n{child_traceback}")
            raise error
        if kind == "done":
            return content[0]
        started = True


def _run_here(module: Callable[[], Module], precision: str, steps: int, warmup: int, root: str | None,
              trainer_kwargs: dict[str, Any]) -> tuple[RunRecord, RunRecord]:
    shared = [_run(module, name, steps, warmup, root, trainer_kwargs) for name in (BASELINE, precision)]
    return tuple(dataclasses.replace(record, memory_measure=f"{record.memory_measure}, shared by both runs")
                 for record in shared)


def _run_both(module: Callable[[], Module], precision: str, steps: int, warmup: int, root: str | None,
              trainer_kwargs: dict[str, Any], isolate: bool) -> tuple[RunRecord, RunRecord]:
    """The float32 run, then the lower precision's, each in its own process where the module can be sent there."""
    if not isolate:
        return _run_here(module, precision, steps, warmup, root, trainer_kwargs)
    try:
        baseline = _run_isolated(module, BASELINE, steps, warmup, root, trainer_kwargs)
    except _CannotIsolate as reason:
        log.warning("compare-precision runs both precisions in this process (%s): each peak memory is this "
                    "process's, shared by both runs. Pass a Module class, or a function or functools.partial "
                    "defined in an importable module, to measure each run in its own process.", reason)
        return _run_here(module, precision, steps, warmup, root, trainer_kwargs)
    try:
        run = _run_isolated(module, precision, steps, warmup, root, trainer_kwargs)
    except _CannotIsolate as reason:
        raise RuntimeError(f"The {precision} run could not run in a process of its own ({reason}); the "
                           f"{BASELINE} run did.") from None
    return baseline, run


def compare_precision(
    module: type[Module] | Callable[[], Module],
    precision: str = "16-mixed",
    *,
    steps: int = 200,
    warmup: int | None = None,
    tolerance: float = 0.05,
    root: str | None = "runs/compare-precision",
    isolate: bool = True,
    **trainer_kwargs: Any,
) -> PrecisionComparison:
    """Train the same module on the same data and seed in float32 and in `precision`, and compare.

    Both runs log to TensorBoard under `root` (`{root}/32-true/...`, `{root}/16-mixed/...`), so
    `tensorboard --logdir root` overlays the two loss curves; with matplotlib installed
    (`pip install ktrainer[plot]`), `{root}/loss-32-true-vs-16-mixed.png` shows them too.

    Each run trains in a fresh process of its own ("spawn"), so its peak memory (the GPU
    allocator's peak, or the process's peak RSS) is its own. The module therefore has to reach
    that process: a Module class or a function importable by name (or by value with cloudpickle
    installed); a script calls `compare_precision` under `if __name__ == "__main__":`. Where it
    cannot, both runs train in this process, with a warning, and share its peak memory.

    Args:
        module: A Module class (called with no arguments) or a function returning a fresh Module.
        precision: The precision to check against "32-true".
        steps: Optimizer steps per run.
        warmup: Steps left out of the gap and the speed; default 10% of `steps`.
        tolerance: The mean relative loss gap up to which the verdict is "tracks".
        root: Where the TensorBoard logs and the plot go; None: no files.
        isolate: Train each run in a process of its own, so that each peak memory is its own;
            False: both in this process (no process start; the memory is shared by both runs).
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
    baseline, run = _run_both(module, precision, steps, warmup, root, trainer_kwargs, check_bool("isolate", isolate))
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
    result = PrecisionComparison(precision, warmup, max_gap, mean_gap, non_finite, run.skipped_steps, ratio,
                                 verdict, baseline, run, tolerance)
    if root:
        result.save_plot(root, trainer_kwargs.get("storage_options"))
    return result
