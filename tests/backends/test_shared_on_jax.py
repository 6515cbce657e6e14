"""The promises both engines keep, checked on JAX: each test file marked `both_backends` passes there too.

The TensorFlow session runs those files in-process; `tests/backends/jax_session.py` runs the same test
functions, with the same assertions, on JAX in a process that refuses TensorFlow, beside this one. These
tests run last and read its report: one per shared file, a failure carrying the JAX session's account of it.
Tests marked `tensorflow_only` in a shared file say why they are not run on JAX.
"""

from __future__ import annotations

import pytest

from tests.backends.jax_session import STASH, JaxSession, shared_files


@pytest.fixture(scope="module")
def jax_session(request) -> JaxSession:
    """The session conftest started when collection ended (or one started now)."""
    if STASH not in request.config.stash:
        request.config.stash[STASH] = JaxSession()
    return request.config.stash[STASH]


@pytest.mark.parametrize("path", shared_files())
def test_the_file_passes_on_jax_without_tensorflow(jax_session, path):
    cases = jax_session.cases().get(path, [])
    assert cases, (f"{path} has both_backends or jax_only tests, but none ran on JAX:\n"
                   f"{jax_session.output.read_text()[-4000:]}")
    problems = [f"{case.get('name')}: {problem.get('message')}\n{problem.text}"
                for case in cases for problem in case if problem.tag in ("failure", "error", "skipped")]
    assert not problems, "on JAX:\n" + "\n\n".join(problems)


def test_the_shared_files_include_the_promises_the_engines_share():
    shared = set(shared_files())
    for promise in ("callbacks/test_callback.py", "checkpoint/test_retention.py", "checkpoint/test_snapshot.py",
                    "precision/test_mixed.py", "loggers/test_tensorboard.py", "checkpoint/test_resume.py"):
        assert f"tests/{promise}" in shared


def test_every_file_with_a_test_marked_for_jax_runs_there():
    from pathlib import Path

    root = Path(__file__).parents[2]
    marked = {str(path.relative_to(root)) for path in (root / "tests").rglob("test_*.py")
              if path != Path(__file__) and ("mark.both_backends" in path.read_text()
                                            or "mark.jax_only" in path.read_text())}
    assert marked <= set(shared_files())
    assert "tests/utils/test_memory.py" in marked  # its marks are a list
