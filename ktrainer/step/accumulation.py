"""A partial gradient-accumulation group in a checkpoint, the same on both engines (so checkpoints move).

Each engine's update rule keeps the gradients summed so far (`sums`, one per variable) and how many
batches they hold (`count`); a checkpoint taken mid-group saves them, and a resumed run continues
the group. The layout, per rule "00", "01", ...: {"count": n, "sums": {"00000": ..., ...}}.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PartialGroup", "groups_state_dict", "groups_mismatch", "load_groups"]


class PartialGroup:
    """The checkpoint side of an update rule's accumulation; the rule has `sums`, `count`, `accumulate` and
    `pending()` (batches in the group now)."""

    sums: list[Any]
    count: Any
    accumulate: int

    def pending(self) -> int:  # pragma: no cover - each engine's rule reads its own count
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The partial group (empty without one)."""
        if self.pending() == 0:
            return {}
        return {"count": self.count, "sums": {f"{i:05d}": total for i, total in enumerate(self.sums)}}

    def mismatch(self, state: dict[str, Any]) -> str:
        """Why a saved partial group does not fit this rule ("" when it does, or there is none)."""
        if not state:
            return ""
        sums = list(state.get("sums", {}).values())
        if self.accumulate == 1 or len(sums) != len(self.sums) or int(state["count"]) >= self.accumulate:
            return (f"The checkpoint holds a partial gradient-accumulation group of {int(state['count'])} batches "
                    f"over {len(sums)} variables; this run accumulates {self.accumulate} batches over "
                    f"{len(self.sums)} variables. Resume with the same accumulate_grad_batches (and model).")
        return ""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a partial group (after `mismatch` found none)."""
        if not state:
            return
        for total, value in zip(self.sums, state["sums"].values(), strict=True):
            total.assign(value)
        self.count.assign(int(state["count"]))


def _rule_key(number: int) -> str:
    """The key of the rule numbered `number` in a checkpoint's groups: "00", "01", ..."""
    return f"{number:02d}"


def groups_state_dict(rules: Sequence[PartialGroup], pending: int) -> dict[str, Any]:
    """The partial group of each rule, by rule key (empty between groups).

    Args:
        rules: The step's update rules, in the order it made them.
        pending: Batches in the current partial group (the step's `pending()`, the largest over its rules).
    """
    if pending == 0:
        return {}
    return {_rule_key(number): rule.state_dict() for number, rule in enumerate(rules)}


def groups_mismatch(rules: Sequence[PartialGroup], state: dict[str, Any]) -> str:
    """Why a checkpoint's partial groups (one per rule) do not fit these rules ("" when they do, or there are none)."""
    if not state:
        return ""
    if set(state) != {_rule_key(number) for number in range(len(rules))}:
        return (f"The checkpoint holds partial gradient-accumulation groups of {len(state)} updates; this run "
                f"makes {len(rules)} per step. Resume with the same training_step and optimizers.")
    return "".join(rule.mismatch(state[_rule_key(number)]) for number, rule in enumerate(rules))


def load_groups(rules: Sequence[PartialGroup], state: dict[str, Any]) -> None:
    """Restore each rule's partial group from `groups_state_dict`'s layout (after `groups_mismatch` found none); a
    rule the state does not name (a checkpoint taken between groups) is left as it is."""
    for number, rule in enumerate(rules):
        rule.load_state_dict(state.get(_rule_key(number), {}))
