"""The checkpoint format: directory and file names, and the manifest, parsed strictly.

One checkpoint is one directory `step-00001200/` holding its data files and `manifest.json`.
Every data file carries the id of the save that wrote it (`model-00000.3f9c0a1b7d2e-4.tensors`,
`trainer.3f9c0a1b7d2e-4.json`): a new save of the same name writes new files and never touches
the ones the current manifest lists. The manifest, written last and whole, is the commit point:
it lists every file with its `name`, `size` and checksum (`crc32c`, 8 hex digits; format 1 used
`sha256`), and records the step, the run that wrote it, the checkpoint that run resumed from and
when it was committed. Anything a manifest does not list is not part of the checkpoint.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["FORMAT_VERSION", "READABLE_VERSIONS", "MANIFEST", "ManifestError", "Manifest", "FileEntry",
           "checkpoint_name", "step_of", "data_file_name", "is_own_file", "run_id_of_file", "parse_manifest",
           "encode_manifest"]

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
MAX_FILE_SIZE = 2**44  # 16 TiB: a declared size above this is not a size a save could have written

_NAME = re.compile(r"step-([0-9]{8,})")
_SAVE_ID = r"(?P<run>[0-9a-f]{12})-[0-9]{1,9}"
_OWN_FILES = (
    re.compile(rf"[a-z_]+-[0-9]{{5}}\.{_SAVE_ID}\.tensors"),
    re.compile(rf"(?:trainer|model_config)\.{_SAVE_ID}\.json"),
    re.compile(rf"{re.escape(MANIFEST)}\.{_SAVE_ID}\.tmp"),
    re.compile(rf"{re.escape(MANIFEST)}|(?:model|optimizer)-[0-9]{{5}}\.tensors|trainer\.json|model_config\.json"),
)
_CHECKSUMS = {"crc32c": re.compile(r"[0-9a-f]{8}"), "sha256": re.compile(r"[0-9a-f]{64}")}


class ManifestError(ValueError):
    """A manifest that is not a usable manifest of a readable format.

    Attributes:
        reason: What is wrong, for listings and warnings.
        newer_format: The format version, when it is one this ktrainer does not know (a newer
            ktrainer wrote it): such a checkpoint is never deleted, and resuming it asks for an upgrade.
    """

    def __init__(self, reason: str, newer_format: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.newer_format = newer_format


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint at `step`, e.g. "step-00001200"."""
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    """The step in a checkpoint directory name, or None when it is not one."""
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def data_file_name(base: str, save_id: str, extension: str) -> str:
    """The name of a data file of one save, e.g. ("model-00000", "3f9c0a1b7d2e-4", "tensors")."""
    return f"{base}.{save_id}.{extension}"


def is_own_file(name: str) -> bool:
    """True for a file name that ktrainer writes inside a checkpoint directory (and may delete)."""
    return any(pattern.fullmatch(name) for pattern in _OWN_FILES)


def run_id_of_file(name: str) -> str | None:
    """The id of the run whose save wrote this file (None for manifests, format-1 and foreign files)."""
    for pattern in _OWN_FILES:
        match = pattern.fullmatch(name)
        if match:
            return match.groupdict().get("run")
    return None


@dataclass(frozen=True)
class FileEntry:
    """One file a manifest lists.

    Attributes:
        name: The file name inside the checkpoint directory.
        size: Its size in bytes.
        algorithm: The checksum algorithm ("crc32c" or "sha256").
        checksum: The checksum as lowercase hex.
    """

    name: str
    size: int
    algorithm: str
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """A parsed, checked manifest.

    Attributes:
        fields: Every field as written (step, epoch, metrics, run_id, parent, committed, ...).
        files: The files of the checkpoint.
    """

    fields: dict[str, Any]
    files: tuple[FileEntry, ...]

    @property
    def format_version(self) -> int:
        """The format version."""
        return self.fields["format_version"]

    @property
    def step(self) -> int:
        """The global step the checkpoint was taken at."""
        return self.fields["step"]

    @property
    def committed(self) -> float:
        """When it was committed (seconds since the epoch; format 1: when it was created)."""
        return float(self.fields.get("committed", self.fields.get("created", 0.0)))

    @property
    def size(self) -> int:
        """Total bytes of its files."""
        return sum(entry.size for entry in self.files)


def _fail(reason: str, newer: int | None = None) -> ManifestError:
    return ManifestError(reason, newer)


def parse_manifest(data: bytes, directory_name: str | None = None) -> Manifest:
    """Parse and check a manifest; raise ManifestError saying what is wrong.

    Checks: JSON object; a known format version; a non-negative integer step (matching the
    directory name when given); `files` a list of entries, each with a plain file name (no
    path, no traversal), an integer size in [0, 16 TiB] and a checksum in the hex form of its
    algorithm; a finite commit time.

    Raises:
        ManifestError: Naming the first problem found.
    """
    try:
        fields = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _fail("manifest is not valid JSON (truncated or corrupt)") from None
    if not isinstance(fields, dict):
        raise _fail(f"manifest is a JSON {type(fields).__name__}, not an object")
    version = fields.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _fail(f"manifest has no integer format_version (found {version!r})")
    if version not in READABLE_VERSIONS:
        if version > FORMAT_VERSION:
            raise _fail(f"format_version {version} is newer than this ktrainer reads (up to {FORMAT_VERSION}): "
                        "written by a newer ktrainer", newer=version)
        raise _fail(f"unknown format_version {version}")
    step = fields.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise _fail(f"manifest step {step!r} is not a non-negative integer")
    if directory_name is not None and step_of(directory_name) not in (None, step):
        raise _fail(f"manifest step {step} does not match the directory name {directory_name}")
    committed = fields.get("committed", fields.get("created", 0.0))
    if not isinstance(committed, int | float) or isinstance(committed, bool) or not _finite(committed):
        raise _fail(f"manifest commit time {committed!r} is not a number")
    files = fields.get("files")
    if not isinstance(files, list) or not files:
        raise _fail("manifest lists no files")
    entries, seen = [], set()
    for entry in files:
        parsed = _file_entry(entry)
        if parsed.name in seen:
            raise _fail(f"manifest lists {parsed.name!r} twice")
        seen.add(parsed.name)
        entries.append(parsed)
    return Manifest(fields, tuple(entries))


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _file_entry(entry: Any) -> FileEntry:
    if not isinstance(entry, dict):
        raise _fail(f"a manifest file entry is a {type(entry).__name__}, not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or name == MANIFEST or name.startswith("."):
        raise _fail(f"manifest file entry has an unsafe or missing name {name!r}")
    size = entry.get("size")
    if not isinstance(size, int) or isinstance(size, bool):
        raise _fail(f"manifest entry {name} has no integer size (found {size!r})")
    if not 0 <= size <= MAX_FILE_SIZE:
        raise _fail(f"manifest entry {name} declares an impossible size {size}")
    for algorithm, pattern in _CHECKSUMS.items():
        if algorithm in entry:
            checksum = entry[algorithm]
            if not isinstance(checksum, str) or not pattern.fullmatch(checksum):
                raise _fail(f"manifest entry {name} has a malformed {algorithm} {checksum!r}")
            return FileEntry(name, size, algorithm, checksum)
    raise _fail(f"manifest entry {name} has no checksum (crc32c or sha256)")


def encode_manifest(fields: dict[str, Any], files: list[FileEntry]) -> bytes:
    """The bytes of a manifest (format `FORMAT_VERSION`) with these fields and files."""
    listed = [{"name": f.name, "size": f.size, f.algorithm: f.checksum} for f in files]
    return json.dumps({**fields, "format_version": FORMAT_VERSION, "files": listed}, indent=1,
                      sort_keys=True).encode()
