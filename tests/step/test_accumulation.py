"""A partial accumulation group in a checkpoint: saved only when there is one, restored, refused when it does not
fit (the layout both engines share, so a checkpoint moves between them)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from ktrainer.step.accumulation import PartialGroup, groups_mismatch, groups_state_dict, load_groups

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


def _as_saved(state: dict) -> dict:
    """A state as a checkpoint gives it back: numpy values, nothing of the variables it was read from."""
    return keras.tree.map_structure(lambda value: np.array(keras.ops.convert_to_numpy(value)), state)


def test_the_groups_of_several_rules_round_trip_by_rule_key():
    rules = [Group(accumulate=3, variables=1), Group(accumulate=3, variables=2)]
    assert groups_state_dict(rules, pending=0) == {}
    rules[0].sums[0].assign(np.array([0.5, -1.0, 2.0], "float32"))
    rules[1].sums[1].assign(np.array([4.0, 5.0, 6.0], "float32"))
    for rule in rules:
        rule.count.assign(2)
    saved = _as_saved(groups_state_dict(rules, pending=2))
    assert sorted(saved) == ["00", "01"]
    assert sorted(saved["01"]["sums"]) == ["00000", "00001"]

    resumed = [Group(accumulate=3, variables=1), Group(accumulate=3, variables=2)]
    assert groups_mismatch(resumed, saved) == ""
    load_groups(resumed, saved)
    assert [rule.pending() for rule in resumed] == [2, 2]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(resumed[0].sums[0]), [0.5, -1.0, 2.0])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(resumed[1].sums[0]), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(resumed[1].sums[1]), [4.0, 5.0, 6.0])


def test_loading_a_checkpoint_taken_between_groups_leaves_the_rules_as_they_are():
    rules = [Group(), Group()]
    rules[1].count.assign(1)
    load_groups(rules, {})
    assert [rule.pending() for rule in rules] == [0, 1]


def test_groups_that_do_not_fit_are_refused_with_the_fix():
    rules = [Group(accumulate=3, variables=1)]
    rules[0].count.assign(2)
    saved = _as_saved(groups_state_dict(rules, pending=2))
    assert groups_mismatch([Group(accumulate=3, variables=1), Group()], saved) == (
        "The checkpoint holds partial gradient-accumulation groups of 1 updates; this run makes 2 per step. "
        "Resume with the same training_step and optimizers.")
    assert groups_mismatch([Group(accumulate=2, variables=1)], saved) == (
        "The checkpoint holds a partial gradient-accumulation group of 2 batches over 1 variables; this run "
        "accumulates 2 batches over 1 variables. Resume with the same accumulate_grad_batches (and model).")
