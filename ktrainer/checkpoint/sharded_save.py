"""A save of a sharded run over several processes: each process writes the slices its devices own, in parallel,
and the chief commits the one manifest only once every process has reported its files.

1. The chief's save id goes to every process (it names every file of the save, so retention and
   leftovers-cleanup know them).
2. Every process but the chief writes its tensor files (`model-00000-p00001.<save>.tensors`, only the
   slices whose owner device is its own) and reports each file's name, size and checksum, or its error.
3. The chief writes its own files (the state file, replicated variables, its slices), then, if no process
   failed, the manifest listing everyone's files: the commit point, as for any save. Until then the
   other processes' files are leftovers no manifest lists.
4. The chief's outcome goes to every process, so all of them raise the same error, or none does.

No process gathers the state: each reads only its own slices to the host. The exchanges go through the
engine (`Engine.gather_json`: an all-process collective), so every process must save at the same step,
which the loop guarantees (every decision to save is agreed). The write is synchronous also with
`async_save` (a collective from a background thread could interleave with the training step's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ktrainer.checkpoint.format import FileEntry
from ktrainer.checkpoint.io import CheckpointError
from ktrainer.checkpoint.payload import checkpoint_payload
from ktrainer.checkpoint.snapshot import slice_index, to_files
from ktrainer.checkpoint.variables import read_value, start_host_copies

if TYPE_CHECKING:
    from ktrainer.trainer import Trainer

__all__ = ["save_sharded", "SaveTarget"]


@dataclass(frozen=True)
class SaveTarget:
    """Where and how a save commits (what the `CheckpointManager` gives it).

    Attributes:
        store: The storage, written synchronously (`FsspecCheckpointIO`).
        url: The directory's URL.
        next_save_id: Makes the chief's id of this save.
        on_commit: Called with the committed checkpoint (retention, the newest URL).
        not_before: The commit time recorded is at least this.
    """

    store: Any
    url: str
    next_save_id: Callable[[], str]
    on_commit: Callable[[Any], None]
    not_before: float


def save_sharded(target: SaveTarget, trainer: Trainer, name: str, fields: dict[str, Any]) -> None:
    """Save checkpoint `name` from every process (see the module's docstring); called by all at the same step.

    Raises:
        CheckpointError: In every process, when any process's write or the chief's commit failed.
    """
    engine, chief = trainer.engine, trainer.is_global_zero
    save_id = engine.gather_json(target.next_save_id() if chief else None)[0]
    state = trainer.state_dict()
    report: dict[str, Any] = {}
    if not chief:
        files = to_files(start_host_copies(state), save_id, read=read_value, process=engine.process_index)
        try:
            written = target.store.write_part(name, files)
            report["files"] = [[e.name, e.size, e.algorithm, e.checksum] for e in written]
            report["slices"] = slice_index(files)
        except CheckpointError as error:
            report["error"] = str(error)
    reports = engine.gather_json(report)
    outcome = _commit(target, trainer, name, fields, save_id, state, reports[1:]) if chief else ""
    outcome = engine.gather_json(outcome)[0]
    if outcome:
        raise CheckpointError(outcome)


def _commit(target: SaveTarget, trainer: Trainer, name: str, fields: dict[str, Any], save_id: str,
            state: dict[str, Any], reports: list[dict[str, Any]]) -> str:
    """The chief's part: its files and the manifest of everyone's; "" when committed, else why not."""
    failed = [f"process {number}: {report['error']}" for number, report in enumerate(reports, 1) if "error" in report]
    if failed:
        return f"The sharded save of {target.url}/{name} failed in another process; nothing was committed. " + \
            "; ".join(failed)
    others = [FileEntry(*entry) for report in reports for entry in report["files"]]
    files, manifest = checkpoint_payload(state, trainer.module.model, trainer.run, save_id, fields)
    manifest["slices"] = {**manifest.get("slices", {}), **{file: held for report in reports
                                                           for file, held in report["slices"].items()}}
    try:
        target.store.write(name, files, manifest, on_commit=target.on_commit, not_before=target.not_before,
                           others=others)
    except CheckpointError as error:
        return str(error)
    return ""
