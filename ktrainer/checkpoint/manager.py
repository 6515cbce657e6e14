"""What a save is, whoever asks for it: the one writer of a run's checkpoints into one directory.

Every save path goes through a `CheckpointManager`: a ModelCheckpoint's scheduled saves (with retention),
`Trainer.save_checkpoint()` (through every ModelCheckpoint) and `Trainer.save_checkpoint(path)` (one
checkpoint where the user says, outside retention). The manager decides nothing about *when*; it makes
every save the same: only the chief process writes; a training position already saved is not saved
again; with `async_save` the state is frozen to host memory before the loop goes on; every manifest
carries the run's id, lineage and the saver's owner; after each commit, retention prunes what the rules
do not keep (only what this owner wrote in this run's lineage; a failed delete is a warning).
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ktrainer.checkpoint.async_io import AsyncCheckpointIO
from ktrainer.checkpoint.format import is_own_file
from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
from ktrainer.checkpoint.host_buffers import HostBuffers
from ktrainer.checkpoint.io import CheckpointError, CheckpointInfo
from ktrainer.checkpoint.payload import checkpoint_payload
from ktrainer.checkpoint.retention import Entry, Retention, to_delete
from ktrainer.checkpoint.sharded_save import SaveTarget, save_sharded
from ktrainer.checkpoint.snapshot import freeze
from ktrainer.checkpoint.variables import start_host_copies
from ktrainer.utils.fs import Location

if TYPE_CHECKING:
    from ktrainer.trainer import Trainer

__all__ = ["CheckpointManager"]

log = logging.getLogger("ktrainer")


class CheckpointManager:
    """Writes checkpoints of the training state into one directory and prunes them.

    Args:
        verify: Read back the manifest and sizes after each save.
        verify_checksums: Also read back every file and check its checksum.
        fsync: On a local disk, flush each checkpoint to the disk before it counts as committed.
        async_save: Write in a background thread; `save` returns once the state is in host memory.

    Attributes:
        owner: The saver's identity, recorded in every manifest; retention deletes only its own checkpoints.
        retention: What to keep after each commit; None keeps everything (a checkpoint saved to a path).
        monitor: The metric that ranks checkpoints for retention's `save_top_k`.
        io: The storage, once `open` named the directory (None before).
        location: The directory, once opened.
        last_saved: The URL of the newest checkpoint committed (the same on every process: the others note
            what the chief wrote).
        saved_position: The training position (`Progress.state_dict()`) of the newest save; a save at the
            same position does nothing. Part of the saver's own state, so a resumed run knows it too.
        resumed_from: The name of the checkpoint in the directory the run resumed from (retention keeps it).
    """

    def __init__(self, *, verify: bool = True, verify_checksums: bool = False, fsync: bool = True,
                 async_save: bool = False) -> None:
        self.verify, self.verify_checksums, self.fsync, self.async_save = verify, verify_checksums, fsync, async_save
        self.owner: str | None = None
        self.retention: Retention | None = None
        self.monitor: str | None = None
        self.io: FsspecCheckpointIO | AsyncCheckpointIO | None = None
        self.location: Location | None = None
        self.last_saved: str | None = None
        self.saved_position: dict[str, Any] | None = None
        self.resumed_from: str | None = None
        self._commit_floor = 0.0
        self._undeletable: set[str] = set()
        self._lineage: frozenset[str] = frozenset()
        self._on_failure: Callable[[], None] | None = None
        self._save_numbers: Iterator[int] = itertools.count(1)
        self._host_buffers = HostBuffers()  # an async snapshot's copies, reused by the next one

    def open(self, location: Location, *, owner: str | None = None, retention: Retention | None = None,
             monitor: str | None = None, save_numbers: Iterator[int] | None = None) -> None:
        """Name the directory and make its storage (nothing is written yet).

        Args:
            location: The directory (existing or not).
            owner: Recorded in every manifest as the saver's identity.
            retention: What to keep after each commit; None keeps everything.
            monitor: The metric that ranks checkpoints for `retention.save_top_k` (read from their manifests).
            save_numbers: With the run id, they make each save's id, which names its data files; default 1, 2, ...
                from here on (a saver that opens a manager per save passes its own, so no two saves share one).
        """
        self.location, self.owner, self.retention, self.monitor = location, owner, retention, monitor
        self._save_numbers = save_numbers if save_numbers is not None else itertools.count(1)
        store = FsspecCheckpointIO(location, verify=self.verify, verify_checksums=self.verify_checksums,
                                   fsync=self.fsync)
        self.io = AsyncCheckpointIO(store) if self.async_save else store
        self.resumed_from = None

    def start_run(self, trainer: Trainer) -> None:
        """Note the checkpoint the run resumed from and the newest commit time in the directory: this run's
        commits come after it, so 'last' is this run's latest even if this host's clock runs behind."""
        run = trainer.run
        self._commit_floor = run.parent_committed
        self._lineage = frozenset(run.lineage)
        if run.parent is not None:
            parent, _, name = run.parent.rpartition("/")
            self.resumed_from = name if parent == self.location.canonical_url else None
        if trainer.is_global_zero:
            try:
                committed = [info.committed for info in self.io.list() if info.manifest is not None]
            except OSError as error:
                log.warning("Could not list %s at the start (%r); commit times follow this host's clock.",
                            self.location.url, error)
                committed = []
            self._commit_floor = max([self._commit_floor, *committed])

    def save(self, trainer: Trainer, name: str, fields: dict[str, Any], *, preempted: bool = False,
             note: Callable[[], Callable[[], None]] | None = None) -> str | None:
        """Save the training state as checkpoint `name`, unless this very position is saved already.

        Args:
            trainer: The Trainer whose state is saved.
            name: The checkpoint's name in the directory.
            fields: The saver's manifest fields (reason, metrics, ...); the run's and the owner's are added.
            preempted: At preemption a failure of the previous background save is logged and the save goes
                ahead (else it is raised).
            note: Called once the save goes ahead, on every process, before the state is taken: the saver
                notes what its own state records of this save (its step, the best value), so the checkpoint
                knows itself, and returns how to undo that should the save fail (synchronously or in the
                background): a failed save does not count as done.

        Returns:
            The checkpoint's URL (on every process; only the chief writes); None when nothing was saved.

        Raises:
            CheckpointError: When this save fails synchronously, or the previous background save failed.
        """
        if self.io is None:
            return None
        chief = trainer.is_global_zero
        try:
            if chief:
                self.wait()  # at most one save in flight; raises a failure of the previous one (then not counted)
        except CheckpointError as error:
            if not preempted:
                raise
            log.error("The previous background save failed (%s); saving at preemption all the same.", error)
        position = trainer.progress.state_dict()
        if position == self.saved_position:
            return None
        before, self.saved_position = self.saved_position, position
        undo = note() if note is not None else None
        url = f"{self.io.url}/{name}"
        if trainer.engine.multi_process and trainer.engine.shards_state:  # every process writes its slices
            self._on_failure = lambda: self._forget(before, undo)
            self.wait()
            target = SaveTarget(getattr(self.io, "inner", self.io), self.io.url,
                                lambda: f"{trainer.run.run_id}-{next(self._save_numbers)}", self._committed,
                                self._commit_floor)
            try:
                save_sharded(target, trainer, name, {**fields, "owner": self.owner})
            except CheckpointError:
                self._failed()
                raise
            self.last_saved = url
            return url
        if not chief:  # the chief writes; every process knows what it wrote
            self.last_saved = url
            return url
        self._on_failure = lambda: self._forget(before, undo)
        try:
            self.write(trainer, name, {**fields, "owner": self.owner})
        except CheckpointError:
            self._failed()
            raise
        return url

    def write(self, trainer: Trainer, name: str, fields: dict[str, Any]) -> CheckpointInfo | None:
        """Write the training state as checkpoint `name` now (the caller is the chief), frozen to host memory
        first with `async_save`; the commit runs retention. Returns what was committed (None while in flight)."""
        run = trainer.run
        state = trainer.state_dict()
        if self.async_save:  # what the loop waits for (the copy to host memory); the writing goes on behind
            self.wait()  # the previous save is written: its host buffers take this snapshot
            state = freeze(start_host_copies(state), self._host_buffers.reader())
        save_id = f"{run.run_id}-{next(self._save_numbers)}"
        files, manifest = checkpoint_payload(state, trainer.module.model, run, save_id, fields)
        return self.io.write(name, files, manifest, on_commit=self._committed, not_before=self._commit_floor)

    def refuse_what_is_not_this_runs(self, name: str, run_lineage: tuple[str, ...]) -> None:
        """Before writing checkpoint `name` outside retention: replace only a checkpoint of this run (or one it
        continues), never another run's, nor a file, nor a folder of other files.

        Raises:
            CheckpointError: Naming what is there and what to do instead.
        """
        [info] = self.io.list(names=[name])
        target = self.location.join(name)
        if info.manifest is not None:
            owner = info.fields.get("run_id")
            if owner is not None and owner not in run_lineage:
                raise CheckpointError(
                    f"{info.url} holds a checkpoint of another run (run {owner}, step {info.step}); ktrainer does "
                    "not overwrite it. Save to another path, or delete it first if it is no longer wanted.")
            return
        if target.fs.isfile(target.path):
            raise CheckpointError(f"{info.url} is a file; a checkpoint is a folder. Pass a new path (it need not "
                                  "exist).")
        held = [child for child in target.children() if not is_own_file(child)]
        if held:
            raise CheckpointError(
                f"{info.url} is a folder holding what is not this checkpoint's ({', '.join(map(repr, held[:3]))}"
                f"{', ...' if len(held) > 3 else ''}): ktrainer writes a checkpoint only into a new or empty "
                "folder, or over a checkpoint of this run. Pass a new path, e.g. a subfolder.")

    def wait(self) -> None:
        """Wait for the save in flight, if any; raise its error (the save then does not count as done)."""
        if isinstance(self.io, AsyncCheckpointIO):
            try:
                self.io.wait()
            except CheckpointError:
                self._failed()
                raise

    def close(self) -> None:
        """Stop the background writer, after the write in flight; give back the snapshots' host buffers."""
        if isinstance(self.io, AsyncCheckpointIO):
            try:
                self.io.close()
            finally:
                self._host_buffers = HostBuffers()

    def _forget(self, position: dict[str, Any] | None, on_failure: Callable[[], None] | None) -> None:
        self.saved_position = position
        if on_failure is not None:
            on_failure()

    def _failed(self) -> None:
        undo, self._on_failure = self._on_failure, None
        if undo is not None:
            undo()

    def _committed(self, info: CheckpointInfo) -> None:
        self._on_failure = None
        self.last_saved = info.url
        self._commit_floor = max(self._commit_floor, info.committed)
        log.debug("Saved checkpoint %s (%.1f MB).", info.url, info.size / 1e6)
        if self.retention is not None:
            self._prune(info.name)

    def _prune(self, newest: str) -> None:
        """Delete what the retention rules do not keep; a failed delete is a warning, never fatal."""
        try:
            listed = self.io.list()
        except Exception as error:  # noqa: BLE001 - retention must never end training
            warnings.warn(f"Could not list {self.location.url} to apply retention: {error!r}.", stacklevel=2)
            return
        entries = [_entry(info, self.monitor) for info in listed]
        protected = [newest] + ([self.resumed_from] if self.resumed_from else [])
        doomed = to_delete(entries, self.retention, owner=self.owner, protected=protected, lineage=self._lineage)
        save_ids = {info.name: info.fields.get("save_id") for info in listed}
        for name in doomed:
            if name in self._undeletable:
                continue  # refused once: asking again at every save would only repeat the warning
            try:
                self.io.delete(name, save_id=save_ids.get(name), run_ids=self._lineage)  # what was listed only
            except Exception as error:  # noqa: BLE001 - e.g. 403 on a write-once bucket: keep training
                self._undeletable.add(name)
                warnings.warn(f"Could not delete checkpoint {self.location.url}/{name} (retention): {error!r}. "
                              "Training goes on; the checkpoint stays (not retried in this run).", stacklevel=2)


def _entry(info: CheckpointInfo, monitor: str | None) -> Entry:
    """A listed checkpoint as retention sees it (its metric: `monitor`'s value in its manifest)."""
    fields = info.fields
    metrics = fields.get("metrics")
    value = metrics.get(monitor) if monitor and isinstance(metrics, dict) else None
    return Entry(info.name, info.step, info.committed, has_manifest=info.has_manifest, complete=info.valid,
                 owner=fields.get("owner"), known_format=info.newer_format is None, symlink=info.symlink,
                 metric=value if isinstance(value, int | float) else None, run_ids=info.run_ids,
                 run_id=fields.get("run_id"))
