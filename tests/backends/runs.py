"""Running training legs in a fresh process (on JAX: one that refuses TensorFlow), from a TensorFlow test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tests.early import StartedProcess

HERE = Path(__file__).parent
LEG_RUN = HERE / "leg_run.py"
SPARSE_RUN = HERE / "sparse_run.py"
NO_TENSORFLOW = HERE / "jax_engine" / "no_tensorflow.py"


def jax_legs(legs: list[dict], cwd: Path, script: Path = LEG_RUN) -> list[dict]:
    """Run `legs` (`script`'s arguments) one after another in one JAX process without TensorFlow."""
    return start_legs(legs, cwd, script, backend="jax").result()


def start_legs(legs: list[dict], cwd: Path, script: Path, backend: str) -> StartedLegs:
    """Start running `legs` (`script`'s arguments) in a process of their own on `backend` ("jax": one without
    TensorFlow; "tensorflow": its own device layout), while the caller goes on."""
    command = [sys.executable, str(NO_TENSORFLOW), str(script)] if backend == "jax" else [sys.executable, str(script)]
    return StartedLegs([*command, json.dumps(legs)], cwd)


class StartedLegs(StartedProcess):
    """A process running training legs; `result()` waits for it (at most 10 minutes) and returns each leg's report
    (what it printed last)."""


def max_difference(first: list, second: list) -> float:
    """The largest absolute difference between two lists of weight arrays."""
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(first, second, strict=True))
