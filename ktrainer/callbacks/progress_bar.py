"""The progress bar: tqdm on a terminal, plain periodic lines elsewhere (CI, log files)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm.auto import tqdm

from ktrainer.callbacks.callback import Callback

__all__ = ["ProgressBar"]


def _format_metrics(metrics: dict[str, float]) -> str:
    return " ".join(f"{name}={value:.4g}" for name, value in metrics.items())


class ProgressBar(Callback):
    """Shows epoch, batch, steps/s, ETA, the loss and the metrics logged with `prog_bar=True`.

    On a terminal it draws a tqdm bar per epoch. When the stream is not a terminal (CI, a log
    file) it prints one plain line every `print_every_secs` seconds and at each epoch end.

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
        self._batches_done = 0

    @property
    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    @property
    def _plain(self) -> bool:
        return self.force_plain or not getattr(self._out, "isatty", lambda: False)()

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        """Start this epoch's bar."""
        self._epoch_start = self._last_print = time.monotonic()
        self._batches_done = trainer.progress.batch_in_epoch
        if not self._plain:
            total = trainer.num_training_batches
            self._bar = tqdm(total=total, initial=self._batches_done, file=self._out, dynamic_ncols=True,
                             desc=self._describe(trainer), unit="step", leave=True)

    def on_train_batch_end(self, trainer: Any, module: Any, metrics: dict[str, float], batch_idx: int) -> None:
        """Advance the bar, or print a line when it is time."""
        advanced = batch_idx + 1 - self._batches_done
        self._batches_done = batch_idx + 1
        if self._bar is not None:
            self._bar.set_postfix_str(_format_metrics(trainer.progress_bar_metrics), refresh=False)
            self._bar.update(advanced)
        elif time.monotonic() - self._last_print >= self.print_every_secs:
            self._print_line(trainer)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        """Show the validation metrics on the bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(_format_metrics(trainer.progress_bar_metrics))

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        """Close the bar, or print the epoch's closing line."""
        if self._bar is not None:
            self._bar.set_postfix_str(_format_metrics(trainer.progress_bar_metrics))
            self._bar.close()
            self._bar = None
        else:
            self._print_line(trainer)

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        """Close the bar so the traceback is readable."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _describe(self, trainer: Any) -> str:
        last = f"/{trainer.max_epochs}" if trainer.max_epochs is not None else ""
        return f"Epoch {trainer.current_epoch + 1}{last}"

    def _print_line(self, trainer: Any) -> None:
        now = time.monotonic()
        self._last_print = now
        done = self._batches_done - trainer.state.first_batch_of_epoch
        elapsed = max(now - self._epoch_start, 1e-9)
        rate = done / elapsed
        total = trainer.num_training_batches
        position = f"{self._batches_done}/{total}" if total else f"{self._batches_done}"
        eta = ""
        if total and rate > 0:
            eta = f" eta {time.strftime('%H:%M:%S', time.gmtime((total - self._batches_done) / rate))}"
        metrics = _format_metrics(trainer.progress_bar_metrics)
        print(f"{self._describe(trainer)} step {position} {rate:.2f} step/s{eta} {metrics}".rstrip(),
              file=self._out, flush=True)
