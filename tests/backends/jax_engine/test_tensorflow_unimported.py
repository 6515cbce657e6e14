"""A JAX run imports no TensorFlow even where it is installed: seeding, TensorBoard logs, checkpoints (with
the model's config), a scaled schedule and `ktrainer ckpt export` included.
A user's own TensorFlow (for tf.data) is still seeded.

Runs in the TensorFlow session, which has TensorFlow installed, each case in a fresh JAX process started as
collection ends (tests/early.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.early import StartedProcess

HERE = Path(__file__).parent


def start_watched_run(folder: Path, *flags: str) -> StartedProcess:
    """tensorflow_watch_run.py in a fresh JAX process (TensorFlow installed), writing into `folder`."""
    return StartedProcess([sys.executable, str(HERE / "tensorflow_watch_run.py"), str(folder), *flags], folder,
                          env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"})


def start_plain(folder: Path) -> StartedProcess:
    """A start (tests/early.py): a whole JAX run."""
    return start_watched_run(folder)


def start_tensorflow_first(folder: Path) -> StartedProcess:
    """A start (tests/early.py): a JAX run whose script imported TensorFlow itself first."""
    return start_watched_run(folder, "--import-tensorflow-first")


def watched_result(started: StartedProcess) -> dict:
    done = started.finished()
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


@pytest.mark.starts_early(start=start_plain)
def test_a_whole_jax_run_never_imports_the_installed_tensorflow(started):
    run = started(start_plain)
    result, tmp_path = watched_result(run), run.cwd
    assert result["step"] == 16 and result["exported"] == 0
    assert result["first_import"] is None, f"TensorFlow was imported from:\n{result['first_import']}"
    assert list((tmp_path / "checkpoints").iterdir())  # the checkpoints and the logs were written
    assert list((tmp_path / "tensorboard" / "version_0").glob("events.out.tfevents.*"))
    assert (tmp_path / "model.keras").stat().st_size > 0  # ktrainer ckpt export
    assert (tmp_path / "checkpoints" / "export" / "last.keras").stat().st_size > 0  # ModelCheckpoint(export_keras)


@pytest.mark.starts_early(start=start_tensorflow_first)
def test_the_seed_still_reaches_tensorflow_when_the_users_script_imported_it(started):
    result = watched_result(started(start_tensorflow_first))
    assert result["tensorflow_seeded"] is True
