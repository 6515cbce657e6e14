"""The checkpoint format: directory and file names, and the manifest, parsed strictly.

One checkpoint is one directory `step-00001200/` holding its data files and `manifest.json`.
With several processes and sharded variables, process p > 0 writes its own slices to
`model-00000-p0000<p>.<save>.tensors` and the chief lists them in the manifest.
Every data file carries the id of the save that wrote it (`model-00000.3f9c0a1b7d2e-4.tensors`,
`trainer.3f9c0a1b7d2e-4.json`): a new save of the same name writes new files and never touches
the ones the current manifest lists. The manifest, written last and whole, is the commit point:
it lists every file with its `name`, `size` and checksum (`crc32c`, 8 hex digits; format 1 used
`sha256`), and records the step, the run that wrote it, the checkpoint that run resumed from and
when it was committed. The manifest checks itself too: `manifest_crc32c` is the CRC32C of its
other fields (canonical JSON), so a flipped bit in a commit time or a metric, which would change
which checkpoint "last" or "best" picks, is caught like one in a file. Anything a manifest does
not list is not part of the checkpoint.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["FORMAT_VERSION", "READABLE_VERSIONS", "MANIFEST", "ManifestError", "Manifest", "FileEntry",
           "checkpoint_name", "step_of", "data_file_name", "split_data_file_name", "is_slice_file", "is_own_file",
           "run_id_of_file", "parse_manifest", "encode_manifest", "self_checksum", "SELF_CHECKSUM"]

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
MAX_FILE_SIZE = 2**44  # 16 TiB: a declared size above this is not a size a save could have written
LATEST_COMMIT = 1e11  # seconds since 1970 (the year 5138): a commit time above it is damage, not a clock
SELF_CHECKSUM = "manifest_crc32c"

_NAME = re.compile(r"step-([0-9]{8,})")
_SAVE_ID = r"(?P<run>[0-9a-f]{12})-[0-9]{1,9}"
_OWN_FILES = (
    re.compile(rf"[a-z_]+-[0-9]{{5}}(?:-p[0-9]{{5}})?\.{_SAVE_ID}\.tensors"),
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


_DATA_FILE = re.compile(r"(?P<base>[a-z_]+(?:-[0-9]{5}(?:-p[0-9]{5})?)?)(?:\.[0-9a-f]{12}-[0-9]{1,9})?"
                        r"\.(?P<extension>tensors|json)")


def split_data_file_name(name: str) -> tuple[str, str] | None:
    """(base, extension) of a data file's name, with or without a save id: ("model-00000", "tensors")."""
    match = _DATA_FILE.fullmatch(name)
    return (match.group("base"), match.group("extension")) if match else None


def is_slice_file(name: str) -> bool:
    """True for a tensor file of one process's slices of sharded variables (`model-00000-p00001.<save>.tensors`)."""
    parts = split_data_file_name(name)
    return parts is not None and parts[1] == "tensors" and _SLICES_BASE.search(parts[0]) is not None


_SLICES_BASE = re.compile(r"-[0-9]{5}-p[0-9]{5}$")


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


def parse_manifest(data: bytes, directory_name: str | None = None) -> Manifest:
    """Parse and check a manifest; raise ManifestError saying what is wrong.

    Checks: JSON object; a known format version; a non-negative integer step (matching the
    directory name when given); `files` a list of entries, each with a plain file name (no
    path, no traversal), an integer size in [0, 16 TiB] and a checksum in the hex form of its
    algorithm; a finite commit time.

    Raises:
        ManifestError: Naming the first problem found.
    """
    fields = _json_object(data)
    version = _format_version(fields)
    _check_step(fields, directory_name)
    _check_commit_time(fields)
    entries = _file_entries(fields.get("files"))
    if version >= 2 and fields.get(SELF_CHECKSUM) != self_checksum(fields):
        raise ManifestError("manifest does not match its own checksum (corrupt)")
    return Manifest(fields, tuple(entries))


def _json_object(data: bytes) -> dict[str, Any]:
    """The manifest's JSON object.

    Raises:
        ManifestError: For bytes that are not JSON, or JSON that is not an object.
    """
    try:
        fields = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ManifestError("manifest is not valid JSON (truncated or corrupt)") from None
    if not isinstance(fields, dict):
        raise ManifestError(f"manifest is a JSON {type(fields).__name__}, not an object")
    return fields


def _format_version(fields: dict[str, Any]) -> int:
    """The manifest's format version, one this ktrainer reads.

    Raises:
        ManifestError: For a missing or unknown version (with `newer_format` set when a newer ktrainer wrote it).
    """
    version = fields.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestError(f"manifest has no integer format_version (found {version!r})")
    if version not in READABLE_VERSIONS:
        if version > FORMAT_VERSION:
            raise ManifestError(f"format_version {version} is newer than this ktrainer reads (up to {FORMAT_VERSION}): "
                        "written by a newer ktrainer", newer_format=version)
        raise ManifestError(f"unknown format_version {version}")
    return version


def _check_step(fields: dict[str, Any], directory_name: str | None) -> None:
    """Check the step: a non-negative integer, the one in the directory name when that is given.

    Raises:
        ManifestError: Naming the step.
    """
    step = fields.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ManifestError(f"manifest step {step!r} is not a non-negative integer")
    if directory_name is not None and step_of(directory_name) not in (None, step):
        raise ManifestError(f"manifest step {step} does not match the directory name {directory_name}")


def _check_commit_time(fields: dict[str, Any]) -> None:
    """Check the commit time (format 1: the creation time): a finite number of seconds a save could have written.

    Raises:
        ManifestError: Naming the time.
    """
    committed = fields.get("committed", fields.get("created", 0.0))
    if not isinstance(committed, int | float) or isinstance(committed, bool) or not _finite(committed) \
            or not 0 <= committed < LATEST_COMMIT:
        raise ManifestError(f"manifest commit time {committed!r} is not a time a save could have written")


def _file_entries(files: Any) -> list[FileEntry]:
    """The manifest's `files`, each entry checked, none listed twice.

    Raises:
        ManifestError: For no files, a bad entry or a name listed twice.
    """
    if not isinstance(files, list) or not files:
        raise ManifestError("manifest lists no files")
    entries, seen = [], set()
    for entry in files:
        parsed = _file_entry(entry)
        if parsed.name in seen:
            raise ManifestError(f"manifest lists {parsed.name!r} twice")
        seen.add(parsed.name)
        entries.append(parsed)
    return entries


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _file_entry(entry: Any) -> FileEntry:
    if not isinstance(entry, dict):
        raise ManifestError(f"a manifest file entry is a {type(entry).__name__}, not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or name == MANIFEST or name.startswith("."):
        raise ManifestError(f"manifest file entry has an unsafe or missing name {name!r}")
    size = entry.get("size")
    if not isinstance(size, int) or isinstance(size, bool):
        raise ManifestError(f"manifest entry {name} has no integer size (found {size!r})")
    if not 0 <= size <= MAX_FILE_SIZE:
        raise ManifestError(f"manifest entry {name} declares an impossible size {size}")
    for algorithm, pattern in _CHECKSUMS.items():
        if algorithm in entry:
            checksum = entry[algorithm]
            if not isinstance(checksum, str) or not pattern.fullmatch(checksum):
                raise ManifestError(f"manifest entry {name} has a malformed {algorithm} {checksum!r}")
            return FileEntry(name, size, algorithm, checksum)
    raise ManifestError(f"manifest entry {name} has no checksum (crc32c or sha256)")


def encode_manifest(fields: dict[str, Any], files: list[FileEntry]) -> bytes:
    """The bytes of a manifest (format `FORMAT_VERSION`) with these fields and files, and its own checksum."""
    listed = [{"name": f.name, "size": f.size, f.algorithm: f.checksum} for f in files]
    manifest = json.loads(json.dumps({**fields, "format_version": FORMAT_VERSION, "files": listed}))
    manifest[SELF_CHECKSUM] = self_checksum(manifest)
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def self_checksum(fields: dict[str, Any]) -> str:
    """CRC32C of a manifest's fields but `manifest_crc32c`, as canonical JSON (what a parsed manifest re-encodes
    to), as 8 lowercase hex digits: a tool checks a manifest with `json.dumps(fields without it, sort_keys=True,
    separators=(",", ":"))`."""
    import google_crc32c

    canonical = {key: value for key, value in fields.items() if key != SELF_CHECKSUM}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return f"{google_crc32c.value(text.encode()):08x}"
