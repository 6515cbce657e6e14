"""The reference run the exact-resume tests compare with: 12 steps straight, in a fresh process, once per session."""

from __future__ import annotations

import pytest

from tests.checkpoint.test_resume import N, leg


@pytest.fixture(scope="session")
def straight_32(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight-32")
    return leg(folder, folder / "run", N, "32-true")
