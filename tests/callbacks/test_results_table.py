"""The results table of a standalone validate()/test(): its exact ASCII box, columns as wide as their widest cell,
an empty table, and values at 6 significant digits (nan and inf included).

(tests/callbacks/test_progress_bar.py covers the Unicode box of two metrics and the table as printed by a run.)
"""

from __future__ import annotations

import numpy as np
import pytest

from ktrainer.callbacks.results_table import format_value, results_table

pytestmark = pytest.mark.both_backends


def test_the_ascii_box_draws_the_same_table_in_plain_characters():
    table = results_table({"val/loss": 0.693147181, "val/acc": 0.5}, "Validate metric", ascii_only=True)
    assert table.splitlines() == [
        "+-----------------+----------+",
        "| Validate metric |  Value   |",
        "+=================+==========+",
        "|     val/acc     |   0.5    |",
        "|    val/loss     | 0.693147 |",
        "+-----------------+----------+",
    ]
    table.encode("ascii")  # a stream that cannot encode box drawing can print it


def test_without_metrics_the_table_is_its_header_in_a_closed_box():
    assert results_table({}, "Test metric").splitlines() == [
        "┏━━━━━━━━━━━━━┳━━━━━━━┓",
        "┃ Test metric ┃ Value ┃",
        "┡━━━━━━━━━━━━━╇━━━━━━━┩",
        "└─────────────┴───────┘",
    ]
    assert results_table({}, "Test metric", ascii_only=True).splitlines()[1] == "| Test metric | Value |"


def test_each_column_is_as_wide_as_its_widest_cell_and_every_line_is_as_wide_as_the_box():
    metrics = {"test/a_very_long_metric_name": -1234567.0, "a": 1.0, "b": float("nan")}
    rows = ["|              a               |      1       |",
            "|              b               |     nan      |",
            "| test/a_very_long_metric_name | -1.23457e+06 |"]
    for ascii_only, edge in ((False, "│"), (True, "|")):
        lines = results_table(metrics, "Test metric", ascii_only=ascii_only).splitlines()
        assert {len(line) for line in lines} == {len(rows[0])}
        assert lines[3:6] == [row.replace("|", edge) for row in rows]


def test_the_table_has_no_trailing_newline():
    table = results_table({"test/loss": 1.0}, "Test metric")
    assert not table.endswith("\n") and len(table.splitlines()) == 5


@pytest.mark.parametrize("value, shown", [
    (0.693147181, "0.693147"),
    (-0.0001234567, "-0.000123457"),
    (1e21, "1e+21"),
    (0, "0"),
    (float("nan"), "nan"),
    (float("-inf"), "-inf"),
    (np.float32(0.1), "0.1"),
    (np.float64(2.5), "2.5"),
])
def test_a_value_is_shown_with_six_significant_digits(value, shown):
    assert format_value(value) == shown
