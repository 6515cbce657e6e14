"""The storage boundary: what a checkpoint store does (write, read, list, delete), and what a listing says."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ktrainer.checkpoint.format import Manifest, step_of

__all__ = ["CheckpointError", "CheckpointInfo", "CheckpointIO", "FileSource", "OnCommit"]


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, unreadable by this ktrainer, or could not be saved."""


class FileSource(Protocol):
    """A file to write that is made while it is written: its size, then its bytes as buffers."""

    nbytes: int

    def chunks(self) -> Iterator[Any]:
        """The file's bytes, as bytes or contiguous buffers, in order."""


OnCommit = Callable[["CheckpointInfo"], None]


@dataclass(frozen=True)
class CheckpointInfo:
    """What a store says of one entry named like a checkpoint.

    Attributes:
        url: The entry's URL.
        valid: True when the manifest is readable and every file it lists is there with its size
            (and its checksum, when checksums were checked).
        reason: Why it is not valid ("" when valid).
        manifest: The parsed manifest, when it could be parsed.
        checksums_checked: True when every file's checksum was checked (and matched, if valid).
        newer_format: The format version when a newer ktrainer wrote it, else None.
        symlink: True when the entry is a symbolic link (read through, never deleted through).
        has_manifest: False for a directory without a manifest (an interrupted save).
        run_ids: For such a directory, the ids of the runs whose saves left files in it.
        storage_error: True when the storage failed to answer (so validity is unknown).
    """

    url: str
    valid: bool
    reason: str = ""
    manifest: Manifest | None = None
    checksums_checked: bool = False
    newer_format: int | None = None
    symlink: bool = False
    has_manifest: bool = True
    run_ids: frozenset[str] = frozenset()
    storage_error: bool = False

    @property
    def name(self) -> str:
        """The entry's name, e.g. "step-00001200"."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def step(self) -> int:
        """The global step it was saved at (from its name when the manifest is unusable; -1 if neither)."""
        if self.manifest is not None:
            return self.manifest.step
        step = step_of(self.name)
        return -1 if step is None else step

    @property
    def fields(self) -> dict[str, Any]:
        """The manifest's fields (empty when it could not be parsed)."""
        return self.manifest.fields if self.manifest is not None else {}

    @property
    def committed(self) -> float:
        """When it was committed (0 when unknown)."""
        return self.manifest.committed if self.manifest is not None else 0.0

    @property
    def size(self) -> int:
        """Total bytes of its files, per the manifest."""
        return self.manifest.size if self.manifest is not None else 0


class CheckpointIO(Protocol):
    """Where checkpoints live: one directory of `step-*` checkpoints on some storage.

    Attributes:
        url: The directory's URL.
    """

    url: str

    def write(self, name: str, files: dict[str, bytes | FileSource], fields: dict[str, Any], *,
              on_commit: OnCommit | None = None, not_before: float = 0.0) -> CheckpointInfo | None:
        """Write the files, then commit the manifest with `fields`; call `on_commit` once committed.

        The commit time recorded is at least `not_before` (commit order stays monotonic along a
        branch when clocks step back).

        Returns:
            The committed checkpoint (None when the write goes on in the background).

        Raises:
            CheckpointError: When the save fails; checkpoints committed before are untouched.
        """

    def read(self, name: str, *, arrays: bool = False) -> tuple[CheckpointInfo, dict[str, Any]]:
        """Read a checkpoint's files, every checksum checked before anything is returned (as bytes; with
        `arrays`, a tensor file may come back as its arrays instead).

        Raises:
            CheckpointError: When it is missing, incomplete, corrupt or of a newer format.
        """

    def list(self, *, checksums: bool = False, names: list[str] | None = None) -> list[CheckpointInfo]:
        """Every entry named like a checkpoint (or the given names), each valid or with the reason why not."""

    def delete(self, name: str, *, save_id: str | None = None, run_ids: frozenset[str] | None = None) -> None:
        """Delete a checkpoint: its manifest first, then only ktrainer's files (see FsspecCheckpointIO.delete)."""
