"""Checkpoint directories on any fsspec filesystem: commit protocol, verification, listing, deletion.

One checkpoint is one directory `step-00001200/` with its state files and `manifest.json`. The
manifest is written last and lists every file with its size and SHA-256: a directory without a
valid manifest, or whose files do not match it, is not a checkpoint. Each file is written whole
with one `pipe_file` call (one PUT on object stores, where rename is a copy), so a crash leaves
at worst a directory without a manifest, which listing and resume ignore and the next save
removes. Only files ktrainer writes are ever deleted.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ktrainer.fs import Location

__all__ = ["CheckpointManager", "CheckpointInfo", "CheckpointError", "MANIFEST", "checkpoint_name"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_OWN_FILE = re.compile(r"(model|optimizer)-\d{5}\.tensors|trainer\.json|model_config\.json|manifest\.json")
_NAME = re.compile(r"step-(\d{8,})")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint at `step`."""
    return f"step-{step:08d}"


@dataclass
class CheckpointInfo:
    """What listing says of one checkpoint directory.

    Attributes:
        url: The directory's URL.
        valid: True when the manifest is there and the files match its sizes (and checksums, if checked).
        reason: Why it is not valid ("" when valid).
        manifest: The manifest (empty when missing or unreadable).
    """

    url: str
    valid: bool
    reason: str = ""
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The directory name, e.g. "step-00001200"."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def step(self) -> int:
        """The global step it was saved at (from its name when the manifest is unreadable)."""
        match = _NAME.fullmatch(self.name)
        return int(self.manifest.get("step", match.group(1) if match else -1))

    @property
    def size(self) -> int:
        """Total bytes of its files, per the manifest."""
        return sum(f["size"] for f in self.manifest.get("files", []))


class CheckpointManager:
    """Reads and writes checkpoint directories under one location.

    Args:
        location: The directory that holds the `step-*` checkpoint directories.
    """

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs = location.fs
        self.root = location.path.rstrip("/")

    def save(self, name: str, files: dict[str, bytes | Callable[[], bytes]], info: dict[str, Any], *,
             verify: bool = True, verify_checksums: bool = False) -> CheckpointInfo:
        """Write the state files, then the manifest; read back what `verify` asks.

        Each file is bytes, or a function returning them, called just before the file is written, so
        a save holds one file (one tensor shard) in memory at a time. Each file is one `pipe_file`
        (one PUT on object stores). A write that fails or is killed half-way leaves no manifest.

        A valid checkpoint of that name is never overwritten (its info is returned); an invalid one
        (a crashed earlier save) is removed first.

        Raises:
            CheckpointError: When verification finds the written checkpoint incomplete.
        """
        directory = f"{self.root}/{name}"
        existing = self.inspect(name)
        if existing.valid:
            return existing
        self._remove_own_files(directory)
        self.fs.makedirs(directory, exist_ok=True)
        listed = []
        for file_name, content in files.items():
            data = content() if callable(content) else content
            self.fs.pipe_file(f"{directory}/{file_name}", data)
            listed.append({"name": file_name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            del data
        manifest = {"format_version": FORMAT_VERSION, "created": time.time(), **info, "files": listed}
        self.fs.pipe_file(f"{directory}/{MANIFEST}", json.dumps(manifest, indent=1, sort_keys=True).encode())
        written = self.inspect(name, checksums=verify_checksums) if verify else CheckpointInfo(
            self._url(name), True, manifest=manifest)
        if not written.valid:
            raise CheckpointError(f"Checkpoint {written.url} failed verification after saving: {written.reason}.")
        return written

    def inspect(self, name: str, *, checksums: bool = False) -> CheckpointInfo:
        """Check one checkpoint: manifest readable, every file present with its size (and checksum)."""
        directory = f"{self.root}/{name}"
        url = self._url(name)
        try:
            manifest = json.loads(self.fs.cat_file(f"{directory}/{MANIFEST}"))
        except FileNotFoundError:
            return CheckpointInfo(url, False, "no manifest (an interrupted save)")
        except (ValueError, UnicodeDecodeError):
            return CheckpointInfo(url, False, "manifest is not valid JSON (an interrupted save)")
        if manifest.get("format_version") != FORMAT_VERSION or "files" not in manifest:
            return CheckpointInfo(url, False, f"unknown manifest format {manifest.get('format_version')!r}", manifest)
        try:
            sizes = {e["name"].rsplit("/", 1)[-1]: e["size"] for e in self.fs.ls(directory, detail=True)}
        except FileNotFoundError:
            sizes = {}
        for entry in manifest["files"]:
            found = sizes.get(entry["name"])
            if found is None:
                return CheckpointInfo(url, False, f"{entry['name']} is missing", manifest)
            if found != entry["size"]:
                return CheckpointInfo(url, False, f"{entry['name']} has {found} bytes, the manifest says "
                                                  f"{entry['size']} (truncated)", manifest)
        if checksums:
            for entry in manifest["files"]:
                data = self.fs.cat_file(f"{directory}/{entry['name']}")
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    return CheckpointInfo(url, False, f"{entry['name']} does not match its checksum", manifest)
        return CheckpointInfo(url, True, "", manifest)

    def read(self, name: str) -> tuple[CheckpointInfo, dict[str, bytes]]:
        """Read a checkpoint's files, checking every checksum before returning anything.

        Raises:
            CheckpointError: When it is missing, incomplete or corrupt.
        """
        info = self.inspect(name)
        if not info.valid:
            raise CheckpointError(f"{info.url} is not a valid checkpoint: {info.reason}.")
        directory = f"{self.root}/{name}"
        files = {}
        for entry in info.manifest["files"]:
            data = self.fs.cat_file(f"{directory}/{entry['name']}")
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise CheckpointError(f"{info.url}: {entry['name']} does not match its checksum (corrupt).")
            files[entry["name"]] = data
        return info, files

    def list(self, *, checksums: bool = False) -> list[CheckpointInfo]:
        """Every `step-*` directory, oldest first, each valid or with the reason it is not."""
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []
        infos = [self.inspect(n, checksums=checksums) for n in names if _NAME.fullmatch(n)]
        return sorted(infos, key=lambda info: info.step)

    def delete(self, name: str) -> None:
        """Delete a checkpoint: only the files ktrainer writes, then the directory if it is empty."""
        self._remove_own_files(f"{self.root}/{name}")

    def _remove_own_files(self, directory: str) -> None:
        try:
            entries = self.fs.ls(directory, detail=False)
        except FileNotFoundError:
            return
        own = [p for p in entries if _OWN_FILE.fullmatch(p.rstrip("/").rsplit("/", 1)[-1])]
        manifest = [p for p in own if p.endswith(MANIFEST)]
        for path in manifest + [p for p in own if not p.endswith(MANIFEST)]:  # invalidate first
            self.fs.rm_file(path)
        if len(own) == len(entries):
            try:
                self.fs.rmdir(directory)
            except (FileNotFoundError, OSError):
                pass  # object stores have no directories to remove

    def _url(self, name: str) -> str:
        return f"{self.location.url.rstrip('/')}/{name}"
