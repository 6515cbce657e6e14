"""The clock that time-triggered decisions read: one clock for every process of a run.

A save every `train_time_interval` seconds is a decision every process must take at the same step (each
notes what the chief saved). Each process's own clock would let them disagree (clocks run apart, and the
processes do not reach a step at the same instant), so with several processes the run's time is the chief's:
each execution carries its reading to every process with the step's other agreed values (the stop vote),
and the loop hands it here when it reads the execution back.
"""

from __future__ import annotations

import time

__all__ = ["RunClock"]


class RunClock:
    """Seconds since the fit started, the same in every process.

    Args:
        shared: Several processes train together: `now` is the chief's reading, as of the last execution
            read back (`agree`); else this process's monotonic clock, read now.
    """

    def __init__(self, shared: bool = False) -> None:
        self.shared = shared
        self._origin = time.monotonic()
        self._agreed = 0.0

    def local(self) -> float:
        """This process's own seconds since the fit started (what the chief shares)."""
        return time.monotonic() - self._origin

    def now(self) -> float:
        """The run's seconds since the fit started: what every decision that must agree reads."""
        return self._agreed if self.shared else self.local()

    def agree(self, chief_seconds: float) -> None:
        """Take the chief's reading that an execution carried (several processes; it never goes back)."""
        self._agreed = max(self._agreed, float(chief_seconds))
