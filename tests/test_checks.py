"""Argument checks: the value comes back when it is right; otherwise the error names the argument, the value
given and what is expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrainer.checks import (
    check_bool,
    check_choice,
    check_count_or_fraction,
    check_fast_dev_run,
    check_int,
    check_path,
    check_storage_options,
    optional,
)

pytestmark = pytest.mark.both_backends


def test_a_choice_lists_every_allowed_value():
    assert check_choice("mode", "min", ("min", "max")) == "min"
    with pytest.raises(ValueError, match="mode='up' is not supported. Use one of: 'min', 'max'."):
        check_choice("mode", "up", ("min", "max"))


@pytest.mark.parametrize("bad", [True, 1.0, "2", -1])
def test_an_int_is_an_int_at_or_above_its_minimum(bad):
    assert check_int("batch_size", 3, minimum=1) == 3
    assert check_int("max_steps", None, minimum=1, allow_none=True) is None
    with pytest.raises(ValueError, match=f"batch_size must be an int >= 0, got {bad!r}."):
        check_int("batch_size", bad, minimum=0)


def test_a_count_or_a_fraction_of_an_epoch():
    assert check_count_or_fraction("limit_train_batches", 5) == 5
    assert check_count_or_fraction("limit_train_batches", 0.25) == 0.25
    assert check_count_or_fraction("limit_val_batches", 0, allow_zero=True) == 0
    for bad in (0, 1.5, True, 0.0):
        with pytest.raises(ValueError, match=r"an int >= 1 \(a number of batches\) or a float in \(0, 1\]"):
            check_count_or_fraction("limit_train_batches", bad)


def test_bools_paths_and_storage_options():
    assert check_bool("shuffle", False) is False
    with pytest.raises(ValueError, match=r"shuffle must be True or False, got 'yes' \(str\)."):
        check_bool("shuffle", "yes")
    assert check_path("default_root_dir", Path("runs")) == "runs"
    with pytest.raises(ValueError, match="default_root_dir must be a non-empty path or URL string, got ''"):
        check_path("default_root_dir", "")
    assert check_storage_options("storage_options", None) == {}
    with pytest.raises(ValueError, match="storage_options must be a dict of fsspec options"):
        check_storage_options("storage_options", [("key", "x")])


def test_optional_checks_and_fast_dev_run_counts():
    assert optional(check_int, "n", None, minimum=1) is None
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        optional(check_int, "n", 0, minimum=1)
    assert (check_fast_dev_run(True), check_fast_dev_run(False), check_fast_dev_run(3)) == (1, 0, 3)
    with pytest.raises(ValueError, match="fast_dev_run must be an int >= 0"):
        check_fast_dev_run(-1)
