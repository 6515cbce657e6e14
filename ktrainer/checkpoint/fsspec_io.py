"""Checkpoints on any fsspec filesystem, and the commit protocol that makes a crash at any moment lose nothing.

A save of `step-00001200`:

1. reads the manifest already there, if any (another run's checkpoint of that name, or an
   abandoned branch), to know its files;
2. writes every data file of this save under a name carrying the save's id, in parallel, each
   whole (one PUT on object stores), checksummed as its bytes go out (and, on a local disk,
   flushed to the disk: `fsync`);
3. commits: writes `manifest.json` whole and atomically (one PUT on object stores; on a local
   disk a temporary file, flushed, renamed over it, and the directory flushed);
4. reads back what `verify` asks, then removes the files of the replaced manifest.

Before step 3 the previous checkpoint of that name, if any, is untouched and valid; after it,
the new one is, durably, before anything is deleted. A failed or killed save leaves at worst
files no manifest lists, which reading and listing ignore. A commit whose outcome is unknown
(the storage failed to answer) is read back: committed, it stands; otherwise its files stay as
leftovers, never deleted under a manifest that might list them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from ktrainer.checkpoint.checksum import ALGORITHM, Checksum
from ktrainer.checkpoint.format import (
    FORMAT_VERSION,
    MANIFEST,
    FileEntry,
    Manifest,
    ManifestError,
    encode_manifest,
    is_own_file,
    parse_manifest,
    run_id_of_file,
    step_of,
)
from ktrainer.checkpoint.io import CheckpointError, CheckpointInfo, FileSource, OnCommit
from ktrainer.checkpoint.slices import ranged_files
from ktrainer.checkpoint.tensor_read import LoadedTensors, read_into_buffers
from ktrainer.checkpoint.workers import io_workers
from ktrainer.utils.fs import Location

__all__ = ["FsspecCheckpointIO", "RangedFile"]

log = logging.getLogger("ktrainer")

class FsspecCheckpointIO:
    """A directory of checkpoints on a local disk, memory://, s3://, gs://, ... (any fsspec URL).

    Args:
        location: The directory that holds the `step-*` checkpoints.
        verify: After each save, read back the manifest and check every file's size.
        verify_checksums: After each save, also read back every file and check its checksum.
        fsync: On a local disk, flush every file and the directory to the disk before the commit
            counts (so a power loss or an OS crash cannot leave a committed manifest without its
            data, nor delete the previous checkpoint first). Object stores are durable on each PUT.
    """

    def __init__(self, location: Location, *, verify: bool = True, verify_checksums: bool = False,
                 fsync: bool = True) -> None:
        self.location = location
        self.fs = location.fs
        self.root = location.path.rstrip("/")
        self.url = location.url.rstrip("/")
        self.verify = verify
        self.verify_checksums = verify_checksums
        self.fsync = fsync and location.is_local

    # ----- write ----------------------------------------------------------------------------

    def write_part(self, name: str, files: dict[str, bytes | FileSource]) -> list[FileEntry]:
        """Write another process's files of checkpoint `name` (its slices), uncommitted: the chief lists them
        in the manifest it commits (`write(..., others=...)`); until then they are leftovers, never listed.

        Returns:
            Each file's entry (name, size, checksum), for the chief's manifest.

        Raises:
            CheckpointError: When a write fails (the files written are removed).
        """
        directory = f"{self.root}/{name}"
        written: list[str] = []
        try:
            self.fs.makedirs(directory, exist_ok=True)
            return self._write_files(directory, files, written)
        except Exception as error:
            self._remove_quietly(directory, written)
            raise _save_failed(self._url(name), error) from error

    def write(self, name: str, files: dict[str, bytes | FileSource], fields: dict[str, Any], *,
              on_commit: OnCommit | None = None, not_before: float = 0.0,
              others: Sequence[FileEntry] = ()) -> CheckpointInfo:
        """Write the files, commit the manifest, verify, clean up what the new manifest replaced.

        Args:
            name: The checkpoint's name, e.g. "step-00001200".
            files: File name (carrying the save id) -> bytes or a `FileSource`.
            fields: The manifest's fields; `save_id` names the temporary manifest.
            on_commit: Called with the committed checkpoint.
            not_before: The commit time recorded is at least this (keeps commit order monotonic
                when clocks step back).
            others: The files the other processes wrote for this save (`write_part`), listed in the manifest.

        Raises:
            CheckpointError: When a write, the commit or the verification fails (with the
                storage's error as its cause); checkpoints committed before are untouched.
        """
        directory = f"{self.root}/{name}"
        save_id = str(fields.get("save_id", "save"))
        written: list[str] = []
        created = False
        try:
            self._check_target(name)
            replaced = self._replaced_files(name)
            created = self.location.is_local and not os.path.isdir(directory)
            self.fs.makedirs(directory, exist_ok=True)
            entries = self._write_files(directory, files, written) + list(others)
            committed = max(time.time(), not_before)
            manifest = encode_manifest({**fields, "committed": committed}, entries)
        except Exception as error:
            self._remove_quietly(directory, written)
            if created:
                _remove_empty_directory(directory)
            raise _save_failed(self._url(name), error) from error
        try:
            self._commit(directory, manifest, save_id, created)
        except Exception as error:
            if not self._committed_anyway(name, save_id):
                raise _save_failed(self._url(name), error) from error  # its files stay: leftovers, never listed
            log.warning("The commit of %s reported %r, but its manifest is there: the save stands.",
                        self._url(name), error)
        info = self._verify_written(name, manifest)
        kept = {entry.name for entry in entries}
        self._remove_quietly(directory, [f for f in replaced if f not in kept])
        if on_commit is not None:
            on_commit(info)
        return info

    def _check_target(self, name: str) -> None:
        directory = f"{self.root}/{name}"
        if self.location.is_local and os.path.islink(directory):
            raise CheckpointError(f"{self._url(name)} is a symbolic link; ktrainer does not write through it. "
                                  "Remove the link or choose another dirpath.")
        self.fs.invalidate_cache(directory)
        if self.fs.isfile(directory):
            raise CheckpointError(f"{self._url(name)} is a file, not a checkpoint directory; move it out of the way "
                                  "or choose another dirpath.")

    def _replaced_files(self, name: str) -> list[str]:
        """ktrainer's files of the manifest a save of `name` replaces (refusing to replace a newer format)."""
        try:
            data = self.fs.cat_file(f"{self.root}/{name}/{MANIFEST}")
        except FileNotFoundError:
            return []
        try:
            manifest = parse_manifest(data)
        except ManifestError as error:
            if error.newer_format is not None:
                raise CheckpointError(f"{self._url(name)} holds a checkpoint of format {error.newer_format}, written "
                                      "by a newer ktrainer; it is not overwritten. Upgrade ktrainer or choose "
                                      "another dirpath.") from None
            return []
        return [entry.name for entry in manifest.files if is_own_file(entry.name)]

    def _write_files(self, directory: str, files: dict[str, bytes | FileSource], written: list[str]) -> list[FileEntry]:
        def write_one(file_name: str) -> FileEntry:
            path = f"{directory}/{file_name}"
            written.append(file_name)
            return self._write_file(path, file_name, files[file_name])

        futures = [io_workers().submit(write_one, file_name) for file_name in files]
        entries, first_error = [], None
        for future in futures:
            try:
                entries.append(future.result())
            except Exception as error:  # noqa: BLE001 - the first failure is raised once all have stopped
                first_error = first_error or error
                for other in futures:
                    other.cancel()
        if first_error is not None:
            raise first_error
        return entries

    def _write_file(self, path: str, file_name: str, content: bytes | FileSource) -> FileEntry:
        checksum = Checksum(ALGORITHM)
        if self.location.is_local:
            size = 0
            with open(path, "wb") as handle:
                for chunk in _chunks(content):
                    handle.write(chunk)
                    checksum.update(chunk)
                    size += memoryview(chunk).nbytes  # bytes, bytearray, memoryview or a contiguous numpy array
                if self.fsync:
                    handle.flush()
                    os.fsync(handle.fileno())
        else:
            body = content if isinstance(content, bytes) else b"".join(content.chunks())
            checksum.update(body)
            size = len(body)
            self.fs.pipe_file(path, body)  # one PUT: the object appears whole or not at all
            del body
        return FileEntry(file_name, size, ALGORITHM, checksum.hexdigest())

    def _commit(self, directory: str, manifest: bytes, save_id: str, created: bool) -> None:
        target = f"{directory}/{MANIFEST}"
        if self.location.is_local:
            temporary = f"{target}.{save_id}.tmp"
            with open(temporary, "wb") as handle:
                handle.write(manifest)
                if self.fsync:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(temporary, target)  # atomic: readers see the old manifest or the new one
            if self.fsync:
                _fsync_directory(directory)
                if created:
                    _fsync_directory(self.root)
        else:
            self.fs.pipe_file(target, manifest)  # a single PUT is atomic on object stores

    def _committed_anyway(self, name: str, save_id: str) -> bool:
        """After a failed commit: is this save's manifest there all the same (the storage applied the write but
        its answer was lost)? Unknown counts as no."""
        try:
            manifest = parse_manifest(self.fs.cat_file(f"{self.root}/{name}/{MANIFEST}"))
        except Exception:  # noqa: BLE001 - unreadable: the save is not known to be committed
            return False
        return manifest.fields.get("save_id") == save_id

    def _verify_written(self, name: str, manifest: bytes) -> CheckpointInfo:
        """Read back what `verify` asks. A mismatch is an error; storage that cannot answer (the commit itself
        went through) is a warning: the checkpoint is committed, and resume checks every checksum anyway."""
        written = CheckpointInfo(self._url(name), True, "", parse_manifest(manifest, name))
        if not self.verify:
            return written
        info = self._inspect(name, checksums=self.verify_checksums)
        if info.valid:
            return info
        if info.storage_error:
            log.warning("Committed checkpoint %s could not be read back to verify it (%s); keeping it. Resume "
                        "checks every checksum before using it.", written.url, info.reason)
            return written
        raise CheckpointError(f"Checkpoint {info.url} failed verification after saving: {info.reason}.")

    # ----- read, list, delete -----------------------------------------------------------------

    def read(self, name: str, *, arrays: bool = False) -> tuple[CheckpointInfo, dict[str, Any]]:
        """Read a checkpoint's files, checking every size and checksum before returning anything.

        The files that hold only slices of sharded variables, each with its own checksum in the manifest
        (`slices.ranged_files`), are not read here: they come back as `RangedFile`, and a restore reads only
        the slices it needs, each checked against its checksum as it is read.

        Args:
            name: The checkpoint's name.
            arrays: A restore's read: on a local disk each tensor file comes back as its arrays, each read into
                its own aligned buffer (`tensor_read.LoadedTensors`), not as bytes.

        Raises:
            CheckpointError: When it is missing, incomplete, corrupt, unreadable or of a newer format.
        """
        info = self._inspect(name, checksums=False)
        if not info.valid:
            raise CheckpointError(_invalid_message(info))
        directory = f"{self.root}/{name}"
        ranged = ranged_files(info.manifest.fields)
        into_buffers = arrays and self.location.is_local and info.manifest.format_version >= 2

        def read_one(entry: FileEntry) -> bytes | LoadedTensors | RangedFile:
            path = f"{directory}/{entry.name}"
            if entry.name in ranged:
                return RangedFile(self.fs, path, f"{info.url}/{entry.name}", entry.size)
            checksum = Checksum(entry.algorithm)
            try:
                if into_buffers and entry.name.endswith(".tensors") and self.fs.size(path) == entry.size:
                    with self.fs.open(path, "rb") as stream:
                        data = read_into_buffers(stream, entry.size, checksum)
                else:
                    data = self.fs.cat_file(path)
                    if len(data) != entry.size:
                        raise CheckpointError(f"{info.url}: {entry.name} has {len(data)} bytes, the manifest says "
                                              f"{entry.size} (truncated).")
                    checksum.update(data)
            except (OSError, EOFError) as error:
                raise CheckpointError(f"{info.url}: {entry.name} could not be read: {error!r}.") from error
            if checksum.hexdigest() != entry.checksum:
                raise CheckpointError(f"{info.url}: {entry.name} does not match its {entry.algorithm} checksum "
                                      "(corrupt).")
            return data

        entries = info.manifest.files
        contents = list(io_workers().map(read_one, entries))
        checked = CheckpointInfo(info.url, True, "", info.manifest, checksums_checked=True, symlink=info.symlink)
        return checked, {entry.name: data for entry, data in zip(entries, contents, strict=True)}

    def list(self, *, checksums: bool = False, names: list[str] | None = None) -> list[CheckpointInfo]:
        """Every entry named like a checkpoint (or the given names), oldest step first, each valid or why not.

        Raises:
            OSError: When the directory itself cannot be listed (what the storage raised).
        """
        if names is None:
            try:
                listed = self._ls(self.root)
            except (FileNotFoundError, NotADirectoryError):
                return []
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in listed]
            names = [n for n in names if step_of(n) is not None]
        infos = [self._inspect(n, checksums=checksums) for n in names]
        return sorted(infos, key=lambda info: (info.step, info.committed, info.name))

    def delete(self, name: str, *, save_id: str | None = None, run_ids: frozenset[str] | None = None) -> None:
        """Delete a checkpoint (or the leftovers of an interrupted save): its manifest first, then its files.

        Only ktrainer's files go: those the manifest lists, and the other ktrainer files of the
        runs `run_ids` (None: of any run); files of yours stay, and so does the directory then.

        Args:
            name: The checkpoint's name.
            save_id: Delete only if the manifest is still this save's (another may have been
                committed under the name since it was listed): the caller's view of it.
            run_ids: Whose unlisted files (leftovers of interrupted saves) go too.

        Raises:
            CheckpointError: For a symbolic link (never deleted through).
            OSError: What the storage raised (e.g. PermissionError on a write-once bucket).
        """
        directory = f"{self.root}/{name}"
        if self.location.is_local and os.path.islink(directory):
            raise CheckpointError(f"{self._url(name)} is a symbolic link; ktrainer never deletes through one.")
        try:
            entries = [p.rstrip("/").rsplit("/", 1)[-1] for p in self._ls(directory)]
        except (FileNotFoundError, NotADirectoryError):
            return
        listed: set[str] = set()
        if MANIFEST in entries:
            try:
                manifest = parse_manifest(self.fs.cat_file(f"{directory}/{MANIFEST}"))
            except ManifestError:
                return  # unreadable or of a newer format: not ours to judge
            if save_id is not None and manifest.fields.get("save_id") != save_id:
                return  # committed again since it was listed
            listed = {entry.name for entry in manifest.files}
        own = [n for n in entries if is_own_file(n) and n != MANIFEST and (
            n in listed or run_ids is None or run_id_of_file(n) in run_ids)]
        if MANIFEST in entries:
            self.fs.rm_file(f"{directory}/{MANIFEST}")  # invalidate first
        for file_name in own:
            self.fs.rm_file(f"{directory}/{file_name}")
        if self.location.is_local and len(own) + (MANIFEST in entries) == len(entries):
            _remove_empty_directory(directory)

    # ----- helpers ----------------------------------------------------------------------------

    def _inspect(self, name: str, *, checksums: bool) -> CheckpointInfo:
        url = self._url(name)
        directory = f"{self.root}/{name}"
        symlink = self.location.is_local and os.path.islink(directory)
        try:
            self.fs.invalidate_cache(directory)
            if not self.fs.isdir(directory):
                exists = self.fs.exists(directory)
                return CheckpointInfo(url, False, "a file named like a checkpoint, not a checkpoint directory"
                                      if exists else "no such checkpoint")
            try:
                data = self.fs.cat_file(f"{directory}/{MANIFEST}")
            except FileNotFoundError:
                return CheckpointInfo(url, False, "no manifest (an interrupted save)", symlink=symlink,
                                      has_manifest=False, run_ids=self._run_ids(directory))
            try:
                manifest = parse_manifest(data, name)
            except ManifestError as error:
                return CheckpointInfo(url, False, error.reason, newer_format=error.newer_format, symlink=symlink)
            reason = self._check_sizes(directory, manifest)
            if not reason and checksums:
                reason = self._check_checksums(directory, manifest)
        except OSError as error:  # the storage could not answer: say so, never a traceback
            return CheckpointInfo(url, False, f"unreadable: {error!r}", symlink=symlink, storage_error=True)
        return CheckpointInfo(url, not reason, reason, manifest, checksums_checked=checksums, symlink=symlink)

    def _ls(self, path: str, detail: bool = False) -> list:
        """A fresh listing (object-store filesystems cache listings; another process may have written since)."""
        self.fs.invalidate_cache(path)
        return self.fs.ls(path, detail=detail)

    def _run_ids(self, directory: str) -> frozenset[str]:
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self._ls(directory)]
        except (FileNotFoundError, NotADirectoryError):
            return frozenset()
        return frozenset(run for run in map(run_id_of_file, names) if run)

    def _check_sizes(self, directory: str, manifest: Manifest) -> str:
        try:
            found = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e for e in self._ls(directory, detail=True)}
        except FileNotFoundError:
            found = {}
        for entry in manifest.files:
            listed = found.get(entry.name)
            if listed is None or listed.get("type") == "directory":
                return f"{entry.name} is missing"
            if listed["size"] != entry.size:
                return f"{entry.name} has {listed['size']} bytes, the manifest says {entry.size} (truncated)"
        return ""

    def _check_checksums(self, directory: str, manifest: Manifest) -> str:
        for entry in manifest.files:
            try:
                data = self.fs.cat_file(f"{directory}/{entry.name}")
            except FileNotFoundError:
                return f"{entry.name} is missing"
            if Checksum.of(data, entry.algorithm) != entry.checksum:
                return f"{entry.name} does not match its {entry.algorithm} checksum (corrupt)"
        return ""

    def _remove_quietly(self, directory: str, file_names: list[str]) -> None:
        for file_name in file_names:
            try:
                self.fs.rm_file(f"{directory}/{file_name}")
            except Exception as error:  # noqa: BLE001 - leftovers are harmless: no manifest lists them
                log.debug("Could not remove %s/%s: %r", directory, file_name, error)

    def _url(self, name: str) -> str:
        return f"{self.url}/{name}"


class RangedFile:
    """A checkpoint file read a byte range at a time (its size checked against the manifest already).

    Args:
        fs: Its filesystem.
        path: Its path there.
        url: Its URL, for messages.
        size: Its size.
    """

    def __init__(self, fs: Any, path: str, url: str, size: int) -> None:
        self.fs, self.path, self.url, self.size = fs, path, url, size

    def read(self, offset: int, nbytes: int) -> bytes:
        """The `nbytes` bytes from `offset`.

        Raises:
            CheckpointError: When the range is not in the file, or the storage fails or returns fewer bytes.
        """
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise CheckpointError(f"{self.url}: bytes {offset}..{offset + nbytes} are outside its {self.size} bytes "
                                  "(the manifest's slices field is damaged).")
        if not nbytes:
            return b""
        try:
            data = self.fs.cat_file(self.path, start=offset, end=offset + nbytes)
        except OSError as error:
            raise CheckpointError(f"{self.url} could not be read: {error!r}.") from error
        if len(data) != nbytes:
            raise CheckpointError(f"{self.url}: {len(data)} bytes at {offset}, {nbytes} expected (truncated).")
        return data


def _save_failed(url: str, error: BaseException) -> CheckpointError:
    if isinstance(error, CheckpointError):
        return error
    return CheckpointError(f"Saving checkpoint {url} failed: {error!r}. Checkpoints committed before are untouched; "
                           "resume from the newest with ckpt_path='last'.")


def _fsync_directory(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove_empty_directory(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # not empty (something appeared meanwhile): leave it


def _chunks(content: bytes | FileSource) -> Any:
    return [content] if isinstance(content, bytes) else content.chunks()


def _invalid_message(info: CheckpointInfo) -> str:
    if info.newer_format is not None:
        return (f"{info.url} was written by a newer ktrainer (checkpoint format {info.newer_format}); this ktrainer "
                f"reads formats up to {FORMAT_VERSION}. Upgrade ktrainer to resume it.")
    return (f"{info.url} is not a valid checkpoint: {info.reason}. Pass another checkpoint, or ckpt_path='last' "
            "to take the newest valid one; `ktrainer ckpt ls` lists them.")
