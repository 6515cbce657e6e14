"""Preemption: a signal (SIGTERM from a spot VM or Kubernetes, SIGUSR1 from SLURM's --signal) ends fit cleanly.

While `fit` runs, the signals are noted, never acted on inside a step: the loop finishes the
step it is in, saves a checkpoint, runs the `on_exception` and teardown hooks, flushes and
closes the loggers, and `fit` raises `Preempted`, a `SystemExit` whose code is 128 + the
signal's number (143 for SIGTERM), the status schedulers read as "stopped by that signal".
More signals while stopping are noted in the log and otherwise ignored: a job's signal often reaches a
worker twice (from the scheduler to its process group, and forwarded by a launcher), and the second must
not cut the save short. SIGKILL stops a process that must stop at once.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

__all__ = ["Preempted", "SignalWatcher", "check_signals", "DEFAULT_SIGNALS"]

log = logging.getLogger("ktrainer")

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")


class Preempted(SystemExit):
    """Raised by `fit` after a preemption signal, once the checkpoint is saved and the hooks ran.

    A `SystemExit`: uncaught, the process exits with status 128 + the signal number and no
    traceback; `except Exception` does not swallow it.

    Attributes:
        signal_name: The signal received, e.g. "SIGTERM".
        step: The global step the run stopped (and was checkpointed) at.
        checkpoint: The URL of the checkpoint saved, or None when checkpointing is off.
    """

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name
        self.step = step
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        saved = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint (checkpointing is off)"
        return f"Preempted by {self.signal_name} at step {self.step}: {saved}."


def check_signals(signals: Any) -> tuple[int, ...]:
    """The signal numbers of the `preemption_signals` argument (names like "SIGTERM", or numbers).

    Raises:
        ValueError: For anything that is not a catchable signal of this platform.
    """
    if signals is None:
        return ()
    if isinstance(signals, str | int) or not isinstance(signals, Sequence):
        raise ValueError(f"preemption_signals must be a list of signal names such as ['SIGTERM', 'SIGUSR1'], "
                         f"or None; got {signals!r}.")
    numbers = []
    for each in signals:
        try:
            number = signal.Signals[each] if isinstance(each, str) else signal.Signals(each)
        except (KeyError, ValueError):
            known = ", ".join(sorted(s.name for s in signal.Signals if s.name.startswith("SIG")
                                     and not s.name.startswith("SIG_")))
            raise ValueError(f"preemption_signals: {each!r} is not a signal of this platform. Known: {known}.") \
                from None
        if number in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"preemption_signals: {number.name} cannot be caught; nothing can save on it.")
        numbers.append(int(number))
    return tuple(dict.fromkeys(numbers))


class SignalWatcher:
    """Notes the given signals while active (a context manager); restores the previous handlers after.

    Handlers can only be installed from the main thread: elsewhere the watcher does nothing
    (and says so once at debug level).

    Args:
        signals: Signal numbers to watch.
    """

    def __init__(self, signals: Sequence[int]) -> None:
        self.signals = tuple(signals)
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalWatcher:
        self.received = None
        if not self.signals:
            return self
        if threading.current_thread() is not threading.main_thread():
            log.debug("fit runs outside the main thread: preemption signals are not watched.")
            return self
        for number in self.signals:
            self._previous[number] = signal.signal(number, self._note)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            log.warning("%s while already stopping: the checkpoint is being saved (SIGKILL stops at once).",
                        signal.Signals(signum).name)
            return
        self.received = signum
        log.warning("Received %s: finishing the current step, then saving a checkpoint and stopping.",
                    signal.Signals(signum).name)
