"""The run's one clock: the chief's reading with several processes, this process's own alone."""

from __future__ import annotations

import ktrainer.loop.run_clock as run_clock
from ktrainer.loop.run_clock import RunClock


class SteppedTime:
    """A monotonic clock that moves only when told."""

    def __init__(self, seconds: float = 100.0):
        self.seconds = seconds

    def monotonic(self) -> float:
        return self.seconds


def test_alone_the_clock_is_this_process_s_seconds_since_the_fit_started(monkeypatch):
    fake = SteppedTime()
    monkeypatch.setattr(run_clock, "time", fake)
    clock = RunClock()
    fake.seconds += 42.5
    assert clock.now() == clock.local() == 42.5
    clock.agree(1000.0)  # nothing to agree on alone: its own clock stays the run's
    assert clock.now() == 42.5


def test_shared_the_clock_is_the_chief_s_last_reading_and_never_goes_back(monkeypatch):
    fake = SteppedTime()
    monkeypatch.setattr(run_clock, "time", fake)
    clock = RunClock(shared=True)
    fake.seconds += 500.0  # this process's own clock runs ahead: it is not what decisions read
    assert clock.now() == 0.0 and clock.local() == 500.0
    clock.agree(61.0)
    assert clock.now() == 61.0
    clock.agree(30.0)  # an older reading (a save's execution read back late) does not turn the clock back
    assert clock.now() == 61.0
