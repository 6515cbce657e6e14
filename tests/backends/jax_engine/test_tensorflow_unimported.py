"""A JAX run imports no TensorFlow even where it is installed: seeding, TensorBoard logs, checkpoints (with
the model's config), a scaled schedule and `ktrainer ckpt export` included.
A user's own TensorFlow (for tf.data) is still seeded.

Runs in the TensorFlow session, which has TensorFlow installed, each case in a fresh JAX process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def watched_run(root: Path, *flags: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "tensorflow_watch_run.py"), str(root), *flags],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def test_a_whole_jax_run_never_imports_the_installed_tensorflow(tmp_path):
    result = watched_run(tmp_path)
    assert result["step"] == 16 and result["exported"] == 0
    assert result["first_import"] is None, f"TensorFlow was imported from:\n{result['first_import']}"
    assert list((tmp_path / "checkpoints").iterdir())  # the checkpoints and the logs were written
    assert list((tmp_path / "tensorboard" / "version_0").glob("events.out.tfevents.*"))
    assert (tmp_path / "model.keras").stat().st_size > 0  # ktrainer ckpt export
    assert (tmp_path / "checkpoints" / "export" / "last.keras").stat().st_size > 0  # ModelCheckpoint(export_keras)


def test_the_seed_still_reaches_tensorflow_when_the_users_script_imported_it(tmp_path):
    result = watched_run(tmp_path, "--import-tensorflow-first")
    assert result["tensorflow_seeded"] is True
