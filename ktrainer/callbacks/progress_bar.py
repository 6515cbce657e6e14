"""The progress bar: tqdm on a terminal, plain periodic lines elsewhere (CI, log files)."""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, TextIO

from tqdm.auto import tqdm

from ktrainer.callbacks.callback import Callback
from ktrainer.callbacks.results_table import results_table

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["ProgressBar", "epoch_steps"]

_TITLES = {"validate": "Validate metric", "test": "Test metric"}


def _format_metrics(metrics: dict[str, float]) -> str:
    return " ".join(f"{name}={value:.4g}" for name, value in metrics.items())


def _clock(seconds: float, decimals: bool = False) -> str:
    """HH:MM:SS (with hundredths when `decimals`)."""
    seconds = max(seconds, 0.0)
    whole = int(seconds)
    text = f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
    return f"{text}.{int((seconds - whole) * 100):02d}" if decimals else text


def epoch_steps(trainer: Trainer) -> int | None:
    """Optimizer steps in one training epoch, as the bar counts them; None when the data's length is unknown.

    The batches are `trainer.num_training_batches` (exact: numpy data, or an int
    `limit_train_batches`), capped by `trainer.estimated_training_batches` (the data's own estimate,
    also for a tf.data.Dataset or PyDataset), then divided by `accumulate_grad_batches`,
    rounding up (an epoch ends with an optimizer step for its last, partial accumulation).
    """
    exact, estimate = trainer.num_training_batches, trainer.estimated_training_batches
    batches = exact if estimate is None else estimate if exact is None else min(exact, estimate)
    return None if batches is None else math.ceil(batches / _accumulation(trainer))


def _accumulation(trainer: Trainer) -> int:
    return trainer.accumulate_grad_batches


class ProgressBar(Callback):
    """Shows epoch, optimizer step, epoch time, steps/s, samples/s, ETA, the loss and the `prog_bar=True` metrics.

    The unit is the optimizer step: with `accumulate_grad_batches=N` an epoch of B batches is
    ceil(B / N) steps, and a step is `global_batch_size * N` samples. The total is known for numpy
    data, an int `limit_train_batches`, and (estimated) a tf.data.Dataset of known cardinality or a
    PyDataset. On a terminal it draws a tqdm bar per epoch. When the stream is not a terminal (CI, a
    log file) it prints one plain line every `print_every_secs` seconds and one at each epoch end,
    with the epoch's time. A standalone `trainer.validate()` or `trainer.test()` ends with a table
    of its results.

    Args:
        stream: Where to write; default sys.stdout.
        print_every_secs: Interval of the plain lines when the stream is not a terminal.
        force_plain: Use plain lines even on a terminal.
    """

    def __init__(self, stream: TextIO | None = None, print_every_secs: float = 10.0,
                 force_plain: bool = False) -> None:
        self.stream = stream
        self.print_every_secs = print_every_secs
        self.force_plain = force_plain
        self._bar = None
        self._epoch_start = 0.0
        self._last_print = 0.0
        self._total: int | None = None
        self._first_step = 0
        self._steps_done = 0
        self._samples_per_step = 0

    @property
    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    @property
    def _plain(self) -> bool:
        return self.force_plain or not getattr(self._out, "isatty", lambda: False)()

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Start this epoch's bar (at the resumed position, when resumed mid-epoch)."""
        self._epoch_start = self._last_print = time.monotonic()
        self._total = epoch_steps(trainer)
        self._first_step = self._steps_done = trainer.progress.batch_in_epoch // _accumulation(trainer)
        self._samples_per_step = trainer.global_batch_size * _accumulation(trainer)
        if not self._plain:
            self._bar = tqdm(total=self._total, initial=self._steps_done, file=self._out, dynamic_ncols=True,
                             desc=self._describe(trainer), unit="step", leave=True)

    def on_train_batch_end(self, trainer: Trainer, module: Module, metrics: dict[str, float], batch_idx: int) -> None:
        """Advance the bar, or print a line when it is time."""
        self._advance_to((batch_idx + 1) // _accumulation(trainer), trainer)
        if self._bar is None and time.monotonic() - self._last_print >= self.print_every_secs:
            self._print_line(trainer)

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """Show the validation metrics on the bar; a standalone `validate()` prints its results table."""
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(trainer))
        self._print_results(trainer)

    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        """Print the results table of `test()`."""
        self._print_results(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """Close the bar, or print the epoch's closing line (with the epoch's time)."""
        batches = trainer.progress.batch_in_epoch
        accumulate = _accumulation(trainer)
        # A finished epoch flushed its last partial accumulation as one more optimizer step.
        steps = math.ceil(batches / accumulate) if trainer.progress.epoch_done else batches // accumulate
        self._advance_to(steps, trainer)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self._print_line(trainer, epoch_end=True)

    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        """Close the bar so the traceback is readable."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _advance_to(self, steps: int, trainer: Trainer) -> None:
        advanced = steps - self._steps_done
        self._steps_done = steps
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(trainer), refresh=False)
            self._bar.update(advanced)

    def _rates(self) -> tuple[float, float, float]:
        """Seconds since the epoch started (or resumed), steps/s and samples/s over them."""
        elapsed = max(time.monotonic() - self._epoch_start, 1e-9)
        steps_per_sec = (self._steps_done - self._first_step) / elapsed
        return elapsed, steps_per_sec, steps_per_sec * self._samples_per_step

    def _postfix(self, trainer: Trainer) -> str:
        _, _, samples_per_sec = self._rates()
        return f"{samples_per_sec:.1f} samples/s, {_format_metrics(trainer.progress_bar_metrics)}".rstrip(", ")

    def _describe(self, trainer: Trainer) -> str:
        last = f"/{trainer.max_epochs}" if trainer.max_epochs is not None else ""
        return f"Epoch {trainer.current_epoch + 1}{last}"

    def _print_line(self, trainer: Trainer, epoch_end: bool = False) -> None:
        self._last_print = time.monotonic()
        elapsed, steps_per_sec, samples_per_sec = self._rates()
        total = self._total
        position = f"{self._steps_done}/{total}" if total else f"{self._steps_done}"
        if epoch_end:
            timing = f"epoch time {_clock(elapsed, decimals=True)}"
        else:
            timing = f"elapsed {_clock(elapsed)}"
            if total and steps_per_sec > 0:
                timing += f" eta {_clock((total - self._steps_done) / steps_per_sec)}"
        metrics = _format_metrics(trainer.progress_bar_metrics)
        print(f"{self._describe(trainer)} step {position} {steps_per_sec:.2f} step/s {samples_per_sec:.1f} samples/s "
              f"{timing} {metrics}".rstrip(), file=self._out, flush=True)

    def _print_results(self, trainer: Trainer) -> None:
        """The results table, for a standalone validate/test run only (not the validation inside fit)."""
        if trainer.state.stage not in _TITLES:
            return
        title = _TITLES[trainer.state.stage]
        print(results_table(trainer.eval_results, title, ascii_only=not _can_encode(self._out, "┏━│")),
              file=self._out, flush=True)


def _can_encode(stream: TextIO, text: str) -> bool:
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return True
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True
