"""The accelerator / strategy / num_nodes / devices checks both engines' plan_devices share."""

from __future__ import annotations

import pytest

from ktrainer.backends.device_arguments import check_device_arguments, check_one_device, chosen_indices


def _names_only(strategy):
    return False


def test_a_strategy_name_is_checked_and_an_object_the_engine_takes_is_not():
    assert check_device_arguments("gpu", "mirrored", 2, ("auto", "mirrored"), _names_only) is False
    assert check_device_arguments("auto", object(), 1, ("auto",), lambda strategy: True) is True


@pytest.mark.parametrize(("accelerator", "strategy", "num_nodes", "match"), [
    ("npu", "auto", 1, "accelerator='npu' is not supported. Use one of: 'auto', 'cpu', 'gpu', 'tpu'."),
    ("cpu", "auto", 0, "num_nodes must be an int >= 1, got 0."),
    ("cpu", "auto", True, "num_nodes must be an int >= 1, got True."),
    ("cpu", "ring", 1, "strategy='ring' is not supported. Use one of: 'auto', 'mirrored'."),
])
def test_wrong_arguments_are_refused_in_order_naming_what_is_allowed(accelerator, strategy, num_nodes, match):
    with pytest.raises(ValueError) as raised:
        check_device_arguments(accelerator, strategy, num_nodes, ("auto", "mirrored"), _names_only)
    assert str(raised.value) == match


def test_the_engine_refuses_an_object_after_accelerator_and_num_nodes_are_checked():
    def refuse(strategy):
        raise ValueError("no strategy objects here")

    with pytest.raises(ValueError, match="accelerator="):
        check_device_arguments("npu", object(), 1, ("auto",), refuse)
    with pytest.raises(ValueError, match="no strategy objects here"):
        check_device_arguments("cpu", object(), 1, ("auto",), refuse)


def test_one_device_on_several_devices_names_the_engines_strategy_for_them():
    check_one_device("one_device", 1, 1, "mirrored")
    check_one_device("mirrored", [0, 1], 2, "mirrored")
    with pytest.raises(ValueError) as raised:
        check_one_device("one_device", [0, 1], 2, "data_parallel")
    assert str(raised.value) == ("strategy='one_device' conflicts with devices=[0, 1] (2 devices). "
                                 "Use strategy='data_parallel' (or 'auto'), or devices=1.")


def test_indices_default_to_every_visible_accelerator_or_one_cpu():
    assert chosen_indices(None, "gpu", 3, str) == [0, 1, 2]
    assert chosen_indices(None, "cpu", 8, str) == [0]
    assert chosen_indices([2, 0], "gpu", 3, str) == [2, 0]
    assert chosen_indices([5], "cpu", None, str) == [5]  # nothing to count: as many as asked for


def test_an_index_beyond_the_visible_devices_gets_the_engines_message():
    with pytest.raises(ValueError, match="^index 3 of 2$"):
        chosen_indices([0, 3], "gpu", 2, lambda index: f"index {index} of 2")
