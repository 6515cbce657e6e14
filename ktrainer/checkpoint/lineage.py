"""A run's identity: its id, the runs it continues, and the checkpoint it resumed from."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

__all__ = ["RunIdentity", "MAX_LINEAGE"]

MAX_LINEAGE = 100  # run ids kept in a manifest: enough to recognise leftovers of any recent ancestor


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class RunIdentity:
    """Who is writing: every `fit` call is a run with its own id; a resumed run names its parent.

    Attributes:
        run_id: 12 hex digits, new for every `fit` call.
        lineage: The ids of the runs this one continues, oldest first, ending with `run_id`.
        parent: The canonical URL of the checkpoint this run resumed from, or None.
        parent_committed: When that checkpoint was committed (0 for a fresh run).
    """

    run_id: str = field(default_factory=_new_id)
    lineage: list[str] = field(default_factory=list)
    parent: str | None = None
    parent_committed: float = 0.0

    def __post_init__(self) -> None:
        if not self.lineage:
            self.lineage = [self.run_id]

    def resumed(self, parent: str, parent_committed: float, parent_lineage: list[str]) -> RunIdentity:
        """This run, continuing the checkpoint `parent` (whose run continued `parent_lineage`)."""
        lineage = [run for run in parent_lineage if isinstance(run, str) and run != self.run_id]
        return RunIdentity(self.run_id, [*lineage[-(MAX_LINEAGE - 1):], self.run_id], parent, parent_committed)
