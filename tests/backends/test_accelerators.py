"""The hardware check at fit start: one clear line per fact that matters for the chosen precision."""

from __future__ import annotations

import logging

import pytest

import ktrainer as kt
from ktrainer.backends.accelerators import Accelerators, hardware_advice
from ktrainer.backends.tensorflow.hardware import visible_accelerators
from tests.helpers import Classifier


def test_cpu_only():
    lines = hardware_advice("16-mixed", "float16", Accelerators())
    assert lines == [lines[0]] and "expect no speedup on CPU; float16 can be slower" in lines[0]
    assert hardware_advice("32-true", "float32", Accelerators()) == []


def test_old_gpu_has_no_tensor_cores():
    (line,) = hardware_advice("16-mixed", "float16", Accelerators(gpus=((6, 1),)))
    assert "compute capability 6.1 (< 7.0), without tensor cores" in line


def test_tpu_with_float16_is_told_to_use_bfloat16():
    (line,) = hardware_advice("16-mixed", "float16", Accelerators(tpus=8))
    assert "use precision='bf16-mixed'" in line


def test_ampere_or_newer_is_told_bf16_is_available():
    (line,) = hardware_advice("16-mixed", "float16", Accelerators(gpus=((8, 0), (9, 0))))
    assert "support precision='bf16-mixed'" in line and "without loss scaling" in line
    assert hardware_advice("16-mixed", "float16", Accelerators(gpus=((7, 5),))) == []
    assert hardware_advice("bf16-mixed", "bfloat16", Accelerators(gpus=((8, 6),))) == []


def test_the_line_is_logged_at_fit_start_on_this_machine(quiet, caplog):
    if visible_accelerators() != Accelerators():
        pytest.skip("this check is for a machine without accelerators")
    with caplog.at_level(logging.INFO, logger="ktrainer"):
        kt.Trainer(max_steps=1, batch_size=32, precision="bf16-mixed", **quiet).fit(Classifier())
    messages = [r.getMessage() for r in caplog.records]
    assert any("precision='bf16-mixed' on CPU only: expect no speedup on CPU" in m for m in messages)
    assert any("precision='bf16-mixed' (policy mixed_bfloat16), compute/variable dtypes: "
               "1 layer bfloat16/float32" in m for m in messages)  # a row of the summary at the start of fit
