"""The process's peak memory: reset to the current size, then raised by what the process touches, and kept."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import ktrainer as kt
from ktrainer.utils.memory import process_peak, reset_process_peak

pytestmark = [pytest.mark.both_backends,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's (elsewhere getrusage)")]

MIB = 2**20


def test_a_peak_after_a_reset_holds_what_the_process_touched_since_and_keeps_it_after_freeing():
    reset_process_peak()
    before, measure = process_peak()
    block = np.ones(96 * MIB, np.uint8)  # every page written: resident
    during, _ = process_peak()
    del block
    after, _ = process_peak()
    assert measure == "process peak RSS"
    assert during - before >= 80 * MIB
    assert after - before >= 80 * MIB  # the block is freed, its peak stays (counters settle to within pages)


def test_on_a_cpu_the_engine_reports_the_process_peak():
    engine = kt.Trainer(max_steps=1, logger=False, enable_progress_bar=False).engine
    engine.reset_peak_memory()
    peak, measure = engine.peak_memory()
    assert measure == "process peak RSS" and peak > 0
