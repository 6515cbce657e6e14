"""What to keep: pure functions over a listing of checkpoints, tested without any storage.

Only a checkpoint this callback owns may be deleted: committed by a callback of the same
identity (its `owner`) in this run or a run it continues (its lineage: never a checkpoint of an
unrelated run in the same directory), of a format this ktrainer knows, not reached through a
symbolic link.
Among those, the newest `max_to_keep` by commit order, the best `save_top_k` by the monitored
metric, every `keep_every_n_steps`-th step and the protected ones (the newest, the one the run
resumed from) are kept. The leftovers of interrupted saves (no manifest) are deleted when every
file in them was written by this run or a run it continues (its lineage): never an in-flight
save of an unrelated run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Entry", "Retention", "to_delete"]


@dataclass(frozen=True)
class Entry:
    """One listed checkpoint, as retention sees it.

    Attributes:
        name: Its name, e.g. "step-00001200".
        step: Its step.
        committed: Its commit time (0 when unknown).
        has_manifest: A manifest file is there (False: an interrupted save).
        complete: The manifest is valid and every file is there with its size.
        owner: The identity of the callback that committed it (None when unknown).
        known_format: Its format is one this ktrainer reads.
        symlink: It is reached through a symbolic link.
        metric: The monitored metric its manifest records, if any.
        run_ids: The run ids carried by its files' names.
        run_id: The run that committed it (None when unknown).
    """

    name: str
    step: int
    committed: float = 0.0
    has_manifest: bool = True
    complete: bool = True
    owner: str | None = None
    known_format: bool = True
    symlink: bool = False
    metric: float | None = None
    run_ids: frozenset[str] = field(default_factory=frozenset)
    run_id: str | None = None


@dataclass(frozen=True)
class Retention:
    """The rules of what to keep.

    Attributes:
        max_to_keep: Keep the newest N by commit order (None: all).
        save_top_k: Also keep the best K by the monitored metric.
        mode: "min" or "max": which metric value is best.
        keep_every_n_steps: Keep the checkpoints at multiples of N steps forever (None: no milestones).
    """

    max_to_keep: int | None = 3
    save_top_k: int = 0
    mode: str = "min"
    keep_every_n_steps: int | None = None

    def keep(self, owned: list[Entry]) -> set[str]:
        """The names of the complete, owned checkpoints these rules keep."""
        by_commit = sorted(owned, key=lambda e: (e.committed, e.step))
        kept = {e.name for e in (by_commit[-self.max_to_keep:] if self.max_to_keep else by_commit)}
        ranked = sorted((e for e in owned if e.metric is not None and math.isfinite(e.metric)),
                        key=lambda e: e.metric, reverse=self.mode == "max")
        kept.update(e.name for e in ranked[: self.save_top_k])
        if self.keep_every_n_steps:
            kept.update(e.name for e in owned if e.step % self.keep_every_n_steps == 0)
        return kept


def to_delete(entries: Iterable[Entry], rules: Retention, *, owner: str, protected: Iterable[str] = (),
              lineage: Iterable[str] = ()) -> list[str]:
    """The names to delete from a listing, under `rules`, for the callback `owner`.

    Args:
        entries: The listing.
        rules: What to keep.
        owner: The identity of the deleting callback: only its own checkpoints are deleted.
        protected: Names never deleted (the newest save, the checkpoint the run resumed from).
        lineage: Run ids of this run and the runs it continues: only their checkpoints, and
            leftovers written only by them, are deleted.

    Returns:
        Names to delete, in listing order.
    """
    entries = list(entries)
    lineage = set(lineage)
    owned = [e for e in entries if e.has_manifest and e.known_format and not e.symlink and e.owner == owner
             and e.run_id in lineage]
    kept = rules.keep([e for e in owned if e.complete]) | set(protected)
    doomed = {e.name for e in owned if e.name not in kept}
    for entry in entries:
        leftover = not entry.has_manifest and not entry.symlink and entry.run_ids
        if leftover and entry.run_ids <= lineage and entry.name not in kept:
            doomed.add(entry.name)
    return [e.name for e in entries if e.name in doomed]
