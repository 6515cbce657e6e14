"""The table of results a standalone `validate()` or `test()` prints, in Lightning's shape."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["format_value", "results_table"]

# Rules: start, fill, middle, end. Rows: left edge, middle, right edge.
_UNICODE = {"top": "┏━┳┓", "header": "┃┃┃", "rule": "┡━╇┩", "row": "│││", "bottom": "└─┴┘"}
_ASCII = {"top": "+-++", "header": "|||", "rule": "+=++", "row": "|||", "bottom": "+-++"}


def format_value(value: float) -> str:
    """A metric value with 6 significant digits (e.g. 0.693147, 1234.57, 1.5e-07)."""
    return f"{value:.6g}"


def results_table(metrics: Mapping[str, float], title: str, *, ascii_only: bool = False) -> str:
    """A box of the metrics, one row per name in sorted order, under a header row.

    Args:
        metrics: name -> value, e.g. {"val/loss": 0.31, "val/acc": 0.92}.
        title: The header of the names' column, e.g. "Validate metric" or "Test metric".
        ascii_only: Draw the box with ASCII characters (for streams that cannot encode box drawing).

    Returns:
        The table's lines, joined by newlines, without a trailing newline.
    """
    rows = [(name, format_value(metrics[name])) for name in sorted(metrics)]
    left = max(len(title), *(len(name) for name, _ in rows)) if rows else len(title)
    right = max(len("Value"), *(len(value) for _, value in rows)) if rows else len("Value")
    box = _ASCII if ascii_only else _UNICODE

    def rule(kind: str) -> str:
        start, fill, middle, end = box[kind]
        return f"{start}{fill * (left + 2)}{middle}{fill * (right + 2)}{end}"

    def line(kind: str, name: str, value: str) -> str:
        edge, middle, end = box[kind]
        return f"{edge} {name:^{left}} {middle} {value:^{right}} {end}"

    lines = [rule("top"), line("header", title, "Value"), rule("rule")]
    lines += [line("row", name, value) for name, value in rows]
    lines.append(rule("bottom"))
    return "\n".join(lines)
