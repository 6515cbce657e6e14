"""A training state (nested dicts of arrays and JSON values) <-> the files of a checkpoint.

Every array in the state (a numpy array, or a variable read when its file is written) goes to a
`.tensors` shard of its top-level section (`model-00000.<save>.tensors`, `optimizer-...`), at
most 32 MiB each (one PUT on object stores; a larger array gets a shard of its own); the rest
goes to `trainer.<save>.json`, where each array is a reference `{"__tensor__": [section, key]}`.
Loading never executes code: JSON and raw array bytes only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ktrainer.checkpoint.format import data_file_name, split_data_file_name
from ktrainer.checkpoint.slices import SLICED, SavedSlices, StoredSlice, sliced_of
from ktrainer.checkpoint.tensors import TensorFile, dtype_from_name, nbytes_of, read_tensors

__all__ = ["to_files", "from_files", "freeze", "is_array", "slice_index", "SHARD_BYTES", "STATE_FILE"]

SHARD_BYTES = 32 * 2**20  # one PUT each; measured faster on S3 than one large PUT or a multipart stream
STATE_FILE = "trainer"
_TENSOR = "__tensor__"
_SECTION = re.compile(r"[a-z_]+", re.ASCII)


def _segment(key: Any) -> str:
    """A dict key as one path segment (JSON-pointer escaping: "~" -> "~0", "/" -> "~1")."""
    return str(key).replace("~", "~0").replace("/", "~1")


def is_array(value: Any) -> bool:
    """True for what a snapshot stores as a tensor: numpy arrays and scalars, variables, tensors."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, str | bytes)


def freeze(state: Any, snapshot: Callable[[Any], np.ndarray] | None = None) -> Any:
    """A copy of `state` whose arrays no later update can change (what a background save needs).

    Args:
        state: The state; numpy arrays in it are copied.
        snapshot: Turns a variable into a host array that later updates leave unchanged
            (e.g. `variables.read_value`); default: a copy.
    """
    if isinstance(state, dict):
        return {key: freeze(value, snapshot) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return [freeze(value, snapshot) for value in state]
    sliced = None if isinstance(state, np.ndarray | np.generic) else sliced_of(state)
    if sliced is not None:  # a sharded variable: its slices, never the whole gathered
        return sliced.frozen(snapshot or (lambda part: np.array(part, copy=True)))
    if isinstance(state, np.ndarray | np.generic) or (is_array(state) and snapshot is None):
        return np.array(state, copy=True)
    if is_array(state):
        return snapshot(state)
    return state


def to_files(state: dict[str, Any], save_id: str, *, extra_json: dict[str, Any] | None = None,
             read: Callable[[Any], np.ndarray] | None = None, process: int = 0) -> dict[str, Any]:
    """The files of `state`: file name -> bytes, or a `TensorFile` made when it is written.

    Args:
        state: Section name (lowercase letters and "_") -> a JSON-able value with arrays anywhere.
        save_id: The save's id, carried by every file name.
        extra_json: Other JSON files by base name (e.g. {"model_config": {...}}).
        read: Turns a stored value into a numpy array when its shard is written.
        process: This process's number. The slices of sharded variables its devices own go to files of their
            own (`model-00000-p00001...`, read back by byte range); process 0 (the chief) writes every other file
            too, another process only its slices' files.

    Raises:
        ValueError: For a section or extra file name that is not lowercase letters and "_" (or is
            the state file's), or keys that collide once made strings.
    """
    sections: dict[str, dict[str, Any]] = {}  # section -> path -> array, in the order the state holds them
    sliced_keys: dict[str, list] = {}  # each slice's path -> [the whole variable's shape, dtype, its region]
    tree = {}
    for section, value in state.items():
        if not _SECTION.fullmatch(section):
            raise ValueError(f"state section {section!r} must be lowercase letters and '_'")
        tree[section] = _with_references(value, section, "", sections, sliced_keys)
    files: dict[str, Any] = {}
    for section, arrays in sections.items():
        groups = {f"-p{process:05d}": {key: value for key, value in arrays.items() if key in sliced_keys}}
        if not process:  # the chief also writes the whole arrays, in files without a process number
            groups[""] = {key: value for key, value in arrays.items() if key not in sliced_keys}
        for suffix, group in sorted(groups.items()):
            for number, shard in enumerate(_shards(group) if group else []):
                held = {key: [f"{section}{key}", *sliced_keys[key]] for key in shard if key in sliced_keys}
                files[data_file_name(f"{section}-{number:05d}{suffix}", save_id, "tensors")] = \
                    TensorFile(shard, read, held)
    if process:
        return files
    files[data_file_name(STATE_FILE, save_id, "json")] = json.dumps(tree, sort_keys=True).encode()
    files.update(_extra_json_files(extra_json or {}, save_id))
    return files


def _with_references(value: Any, section: str, path: str, sections: dict[str, dict[str, Any]],
                     sliced_keys: dict[str, list]) -> Any:
    """`value` (at `path` in `section`) with each array replaced by its reference, the array put in `sections`
    (and the path of each slice of a sharded variable in `sliced_keys`).

    Raises:
        ValueError: For a dict whose keys collide as strings, or whose only key is the reference key.
    """
    if isinstance(value, dict):
        keys = [str(k) for k in value]
        if len(set(keys)) != len(keys) or keys == [_TENSOR]:
            raise ValueError(f"state {section}{path} has keys that collide as strings, or is a dict whose only "
                             f"key is {_TENSOR!r}: {sorted(keys)}")
        return {str(k): _with_references(v, section, f"{path}/{_segment(k)}", sections, sliced_keys)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        if all(isinstance(v, int | float | str | bool | None) for v in value):
            return list(value)  # the common case (a random generator's state): nothing to look into
        return [_with_references(v, section, f"{path}/{i}", sections, sliced_keys) for i, v in enumerate(value)]
    sliced = None if isinstance(value, np.ndarray | np.generic) else sliced_of(value)
    if sliced is not None:
        parts = []
        for number, region in enumerate(sliced.regions):
            key = f"{path}@{number}"
            if region in sliced.parts:  # this process's slice (the others' are written by their processes)
                sections.setdefault(section, {})[key] = sliced.parts[region]
                sliced_keys[key] = [list(sliced.shape), sliced.dtype, [list(bounds) for bounds in region]]
            parts.append([section, key, [list(bounds) for bounds in region]])
        return {SLICED: {"shape": list(sliced.shape), "dtype": sliced.dtype, "parts": parts}}
    if is_array(value):
        sections.setdefault(section, {})[path] = value
        return {_TENSOR: [section, path]}
    return value


def _extra_json_files(extra_json: dict[str, Any], save_id: str) -> dict[str, bytes]:
    """The other JSON files of a save, by file name.

    Raises:
        ValueError: For a base name that is not lowercase letters and "_", or is the state file's.
    """
    files = {}
    for base, value in extra_json.items():
        if not _SECTION.fullmatch(base) or base == STATE_FILE:
            raise ValueError(f"extra JSON file name {base!r} must be lowercase letters and '_', not {STATE_FILE!r}")
        files[data_file_name(base, save_id, "json")] = json.dumps(value).encode()
    return files


def from_files(files: dict[str, Any], ranged: dict[str, list] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parse the files `to_files` wrote.

    Args:
        files: File name -> its bytes, or (a file of slices, `ranged`) a file read by byte range.
        ranged: The manifest's entries of the files read by range (`slices.ranged_files`): their slices
            become `StoredSlice`s, read only when a region needs them.

    Returns:
        (state, extra_json): the state with numpy arrays (read-only views of the file bytes) in
        place of the references, and the other JSON files by base name.

    Raises:
        ValueError: When a file is malformed or a referenced tensor is missing.
        CheckpointError: When a slice's listed byte count does not fit its shape and dtype.
    """
    tensors: dict[str, dict[str, Any]] = {}
    documents: dict[str, Any] = {}
    ranged = ranged or {}
    for name in sorted(files):
        base, extension = split_data_file_name(name) or ("", "")
        if extension == "tensors" and "-" in base:
            tensors.setdefault(base.split("-", 1)[0], {}).update(
                _stored_slices(files[name], ranged[name]) if name in ranged else read_tensors(files[name]))
        elif extension == "json" and "-" not in base:
            documents[base] = json.loads(files[name])
    if STATE_FILE not in documents:
        raise ValueError(f"the checkpoint has no {STATE_FILE} state file")

    def tensor(section: str, path: str) -> np.ndarray:
        try:
            return tensors[section][path]
        except KeyError:
            raise ValueError(f"the checkpoint's state refers to a tensor {section}{path} it does not hold") from None

    state = _resolve(documents.pop(STATE_FILE), tensor)
    return state, documents


def _stored_slices(file: Any, entries: list) -> dict[str, StoredSlice]:
    """The slices a file read by byte range holds (its manifest entries), by key, none read yet."""
    slices = {}
    for tensor, _, dtype, region, where in entries:
        key = "/" + str(tensor).partition("/")[2]
        shape = tuple(int(stop) - int(start) for start, stop in region)
        slices[key] = StoredSlice(file, tensor, shape, dtype_from_name(str(dtype)), where)
    return slices


def slice_index(files: dict[str, Any]) -> dict[str, list]:
    """Which slices of sharded variables each tensor file of `files` holds, as the manifest's `slices` field
    records them: {file name: [[section + key, the whole variable's shape, dtype, [[start, stop], ...],
    {"offset", "nbytes", "crc32c"}], ...]} (each checksum is there once the file is written)."""
    return {name: content.slices for name, content in files.items() if getattr(content, "slices", None)}


def _resolve(value: Any, tensor: Callable[[str, str], np.ndarray]) -> Any:
    """The state file's `value` with each tensor reference replaced by its array (or `SavedSlices`)."""
    if isinstance(value, dict):
        if set(value) == {SLICED}:
            return _saved_slices(value[SLICED], tensor)
        if set(value) == {_TENSOR}:
            return tensor(*value[_TENSOR])
        return {k: _resolve(v, tensor) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, tensor) for v in value]
    return value


def _saved_slices(reference: Any, tensor: Callable[[str, str], np.ndarray]) -> SavedSlices:
    """A `__sliced__` reference with its tensors (slices.py).

    Raises:
        ValueError: For a malformed reference, or slices that do not make up the variable.
    """
    try:
        parts = [(tuple((int(a), int(b)) for a, b in region), tensor(section, path))
                 for section, path, region in reference["parts"]]
        return SavedSlices(tuple(int(d) for d in reference["shape"]), dtype_from_name(str(reference["dtype"])), parts)
    except (KeyError, TypeError) as error:
        raise ValueError(f"the checkpoint's state has a malformed sliced variable ({error!r})") from None


def _shards(arrays: dict[str, Any]) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for key, value in arrays.items():
        nbytes = nbytes_of(value)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][key] = value
        size += nbytes
    return shards
