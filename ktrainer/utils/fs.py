"""fsspec access shared by loggers and checkpoints: a URL or path -> a filesystem and a path on it."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["Location", "next_version"]


@dataclass(frozen=True)
class Location:
    """A directory on any fsspec filesystem: a local path, file://, memory://, s3://, gs://, ...

    Args:
        url: The path or URL.
        storage_options: Passed to the filesystem (credentials, endpoint, ...).
    """

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def _resolved(self) -> tuple[fsspec.AbstractFileSystem, str]:
        return fsspec.core.url_to_fs(self.url, **self.storage_options)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem of this location."""
        return self._resolved[0]

    @property
    def path(self) -> str:
        """The path of this location on its filesystem (no protocol)."""
        return self._resolved[1]

    @property
    def canonical_url(self) -> str:
        """One spelling per place: `file://` + the real absolute path (symlinks resolved) on a local
        disk, `protocol://` + the normalized path elsewhere. "./runs", "runs/", "file:///abs/runs"
        and a symlink to it compare equal."""
        if self.is_local:
            return "file://" + os.path.realpath(os.path.abspath(self.path))
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        path = posixpath.normpath("/" + self.path.strip("/")).lstrip("/")
        return f"{protocol}://{path}"

    @property
    def is_local(self) -> bool:
        """True when the location is on the local disk."""
        return isinstance(self.fs, LocalFileSystem)

    def join(self, *parts: str) -> Location:
        """The location of a child path."""
        return Location("/".join([self.url.rstrip("/"), *parts]), self.storage_options)

    def exists(self) -> bool:
        """True if something exists at this location."""
        return self.fs.exists(self.path)

    def makedirs(self) -> None:
        """Create the directory (a no-op on object stores, where directories are implicit)."""
        self.fs.makedirs(self.path, exist_ok=True)

    def children(self) -> list[str]:
        """Base names of the entries directly under this location (empty if it does not exist)."""
        fs = self.fs
        if not fs.exists(self.path):
            return []
        return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(self.path, detail=False))

    def write_bytes(self, name: str, data: bytes, *, atomic: bool = False) -> None:
        """Write a whole file under this location (one PUT on object stores), creating the directory.

        Args:
            name: The file name.
            data: Its bytes.
            atomic: On a local disk, write a temporary file and rename it over `name`, so a reader
                never sees half a file (one PUT on object stores is atomic already).
        """
        self.makedirs()
        path = f"{self.path.rstrip('/')}/{name}"
        if atomic and self.is_local:
            temporary = f"{path}.{os.getpid()}.tmp"
            with open(temporary, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        else:
            self.fs.pipe_file(path, data)

    def read_bytes(self, name: str) -> bytes:
        """Read a whole file under this location."""
        with self.fs.open(f"{self.path.rstrip('/')}/{name}", "rb") as handle:
            return handle.read()

    def upload(self, local_file: str, name: str) -> None:
        """Copy a local file to `name` under this location."""
        self.makedirs()
        self.fs.put_file(local_file, f"{self.path.rstrip('/')}/{name}")

    def __str__(self) -> str:
        return self.url


def next_version(parent: Location) -> int:
    """The next free `version_N` number under `parent` (0 when there is none)."""
    numbers = [int(m.group(1)) for name in parent.children() if (m := re.fullmatch(r"version_(\d+)", name))]
    return max(numbers) + 1 if numbers else 0
