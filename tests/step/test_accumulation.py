"""A partial accumulation group in a checkpoint: saved only when there is one, restored, refused when it does not
fit (the layout both engines share, so a checkpoint moves between them)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from ktrainer.step.accumulation import PartialGroup, groups_mismatch

pytestmark = pytest.mark.both_backends


class Group(PartialGroup):
    def __init__(self, accumulate: int = 4, variables: int = 2):
        self.accumulate = accumulate
        self.sums = [keras.Variable(np.zeros(3, "float32"), trainable=False) for _ in range(variables)]
        self.count = keras.Variable(0, dtype="int32", trainable=False)

    def pending(self) -> int:
        return int(keras.ops.convert_to_numpy(self.count))


def test_nothing_is_saved_between_groups_and_a_partial_group_round_trips():
    group = Group()
    assert group.state_dict() == {}
    group.sums[1].assign(np.array([1.0, 2.0, 3.0], "float32"))
    group.count.assign(3)
    saved = {"count": int(keras.ops.convert_to_numpy(group.state_dict()["count"])),
             "sums": {key: keras.ops.convert_to_numpy(v) for key, v in group.state_dict()["sums"].items()}}
    assert sorted(saved["sums"]) == ["00000", "00001"]
    other = Group()
    assert other.mismatch(saved) == ""
    other.load_state_dict(saved)
    assert other.pending() == 3
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(other.sums[1]), [1.0, 2.0, 3.0])


def test_a_group_that_does_not_fit_is_named_with_the_fix():
    saved = {"count": 3, "sums": {"00000": np.zeros(3), "00001": np.zeros(3)}}
    for group in (Group(accumulate=2), Group(accumulate=1), Group(variables=3)):
        assert "Resume with the same accumulate_grad_batches (and model)" in group.mismatch(saved)
    assert groups_mismatch([Group()], {}) == ""
    assert "makes 1 per step" in groups_mismatch([Group()], {"00": saved, "01": saved})
    assert groups_mismatch([Group(), Group()], {"00": saved, "01": saved}) == ""
