"""Running training legs on the JAX backend in a fresh process that refuses TensorFlow, from a TensorFlow test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
LEG_RUN = HERE / "leg_run.py"
NO_TENSORFLOW = HERE / "jax_engine" / "no_tensorflow.py"


def jax_legs(legs: list[dict], cwd: Path) -> list[dict]:
    """Run `legs` (leg_run.py's arguments) one after another in one JAX process without TensorFlow."""
    done = subprocess.run([sys.executable, str(NO_TENSORFLOW), str(LEG_RUN), json.dumps(legs)], capture_output=True,
                          text=True, timeout=600, cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_difference(first: list, second: list) -> float:
    """The largest absolute difference between two lists of weight arrays."""
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(first, second, strict=True))
