"""The `devices` argument read the same way by both engines."""

from __future__ import annotations

import pytest

from ktrainer.backends.device_list import requested_indices


def test_a_count_a_list_and_auto():
    assert requested_indices(3) == [0, 1, 2]
    assert requested_indices([2, 0]) == [2, 0]
    assert requested_indices("auto") is None


@pytest.mark.parametrize(("devices", "match"), [
    (0, "must be >= 1"), ([], "must hold indices >= 0"), ([0, -1], "must hold indices >= 0"),
    ([0, True], "must hold indices >= 0"), ([1, 1], "repeats an index"), ("two", "must be 'auto', an int"),
    (True, "must be 'auto', an int"),
])
def test_anything_else_is_refused_naming_what_is_allowed(devices, match):
    with pytest.raises(ValueError, match=match):
        requested_indices(devices)
