"""Run a script on the JAX backend in a process whose import system refuses TensorFlow.

    python no_tensorflow.py SCRIPT [ARGS...]
    python no_tensorflow.py -m MODULE [ARGS...]     (e.g. -m pytest)

Any import of `tensorflow` (by ktrainer, Keras or a library) raises ModuleNotFoundError, as in an
environment where TensorFlow is not installed: the script passing proves the JAX path needs none.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys


class RefuseTensorFlow(importlib.abc.MetaPathFinder):
    """A meta-path finder that makes every `tensorflow` import fail, and counts the attempts."""

    attempts: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            self.attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (refused: this run must not need TensorFlow)",
                                      name=name)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, RefuseTensorFlow())
    os.environ["KERAS_BACKEND"] = "jax"
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
