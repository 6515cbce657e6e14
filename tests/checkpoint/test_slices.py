"""A sharded variable in a checkpoint: its slices written with their place in the whole, and any region read back
from the slices that overlap it (what a run on another mesh asks for), checked to make up the variable exactly."""

from __future__ import annotations

import numpy as np
import pytest

from ktrainer.checkpoint.slices import SavedSlices, Sliced
from ktrainer.checkpoint.snapshot import freeze, from_files, to_files

WHOLE = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
# Four row blocks of 2, as a (4, x) mesh splits dimension 0.
REGIONS = [((row, row + 2), (0, 6)) for row in range(0, 8, 2)]


def _sliced() -> Sliced:
    return Sliced((8, 6), "float32", REGIONS, {r: WHOLE[r[0][0]:r[0][1]] for r in REGIONS})


def _bytes(files: dict) -> dict[str, bytes]:
    return {name: content if isinstance(content, bytes) else b"".join(bytes(c) for c in content.chunks())
            for name, content in files.items()}


def test_a_sliced_variable_round_trips_and_any_region_reads_from_the_slices_it_overlaps():
    state, _ = from_files(_bytes(to_files({"model": {"kernel": _sliced(), "bias": np.ones(3, np.float32)}}, "a" * 12
                                                    + "-1")))
    saved = state["model"]["kernel"]
    assert isinstance(saved, SavedSlices) and saved.shape == (8, 6) and saved.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(saved), WHOLE)
    # A (2, 3) mesh's device holds rows 4..8 and columns 3..6: it spans two saved slices.
    np.testing.assert_array_equal(saved.region((slice(4, 8), slice(3, 6))), WHOLE[4:8, 3:6])
    np.testing.assert_array_equal(saved.region((slice(None), slice(0, 1))), WHOLE[:, :1])
    np.testing.assert_array_equal(state["model"]["bias"], np.ones(3))
    # The same layout as saved: each device's region is its slice itself (no copy of the state on restore).
    part = saved.region((slice(2, 4), slice(None)))
    assert any(np.shares_memory(part, values) for _, values in saved.parts)


def test_a_background_save_freezes_each_slice_not_the_gathered_whole():
    live = {r: WHOLE[r[0][0]:r[0][1]].copy() for r in REGIONS}
    frozen = freeze({"model": {"kernel": Sliced((8, 6), "float32", REGIONS, live)}})["model"]["kernel"]
    for part in live.values():
        part += 100  # the training goes on
    assert isinstance(frozen, Sliced) and frozen.regions == REGIONS
    np.testing.assert_array_equal(np.concatenate([frozen.parts[r] for r in REGIONS]), WHOLE)


def test_only_this_process_slices_are_written_but_every_slice_is_named():
    mine = Sliced((8, 6), "float32", REGIONS, {REGIONS[1]: WHOLE[2:4]})  # another process writes the other three
    files = to_files({"model": {"kernel": mine}}, "b" * 12 + "-1")
    (tensors,) = [f for name, f in files.items() if name.endswith(".tensors")]
    assert list(tensors.arrays) == ["/kernel@1"]
    with pytest.raises(ValueError, match="does not hold"):
        from_files(_bytes(files))
    # Process 1 writes its slices only, in files of its own; the chief writes the state file and the rest.
    state = {"model": {"kernel": mine, "bias": np.ones(3, np.float32)}, "run": {"step": 1}}
    assert sorted(to_files(state, "b" * 12 + "-1", process=1)) == [f"model-00000-p00001.{'b' * 12}-1.tensors"]
    assert list(to_files(state, "b" * 12 + "-1", process=1).values())[0].arrays.keys() == {"/kernel@1"}


@pytest.mark.parametrize(("parts", "says"), [
    ([(REGIONS[0], WHOLE[0:2])], "cover 12 of the 48"),
    ([(r, WHOLE[r[0][0]:r[0][1]]) for r in REGIONS] + [(REGIONS[0], WHOLE[0:2])], "cover 60 of the 48"),
    ([(((0, 8), (0, 6)), WHOLE[:4])], "does not fit"),
    ([(((0, 8), (0, 7)), np.zeros((8, 7), np.float32))], "does not fit"),
])
def test_slices_that_do_not_make_up_the_variable_are_refused(parts, says):
    with pytest.raises(ValueError, match=says):
        SavedSlices((8, 6), np.float32, parts)


class _RecordedReads:
    """A real filesystem whose whole-file and ranged reads are recorded (path's file name, start, end)."""

    def __init__(self, fs) -> None:
        self._fs, self.reads = fs, []

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.reads.append((path.rsplit("/", 1)[-1], start, end))
        return self._fs.cat_file(path, start=start, end=end, **kwargs)

    def __getattr__(self, name):
        return getattr(self._fs, name)


def _saved_through_storage(tmp_path):
    """The sliced kernel (and a replicated bias) saved through real storage; the store, reading recorded."""
    from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO
    from ktrainer.checkpoint.snapshot import slice_index
    from ktrainer.utils.fs import Location

    store = FsspecCheckpointIO(Location(str(tmp_path)))
    save_id = "c" * 12 + "-1"
    files = to_files({"model": {"kernel": _sliced(), "bias": np.ones(3, np.float32)}, "run": {}}, save_id)
    fields = {"step": 1, "save_id": save_id, "run_id": "c" * 12, "slices": slice_index(files)}
    store.write("step-00000001", files, fields)  # each slice's checksum is filled in as its file is written
    store.fs = _RecordedReads(store.fs)
    return store


def test_a_restore_reads_only_the_byte_ranges_of_the_slices_a_region_overlaps_each_checked(tmp_path):
    from ktrainer.checkpoint.fsspec_io import RangedFile
    from ktrainer.checkpoint.slices import ranged_files

    store = _saved_through_storage(tmp_path)
    info, files = store.read("step-00000001")
    (sliced_file,) = ranged_files(info.manifest.fields)
    assert sliced_file.startswith("model-00000-p00000.") and isinstance(files[sliced_file], RangedFile)
    entries = info.manifest.fields["slices"][sliced_file]
    assert [entry[4]["nbytes"] for entry in entries] == [2 * 6 * 4] * 4 and all(len(e[4]["crc32c"]) == 8
                                                                                  for e in entries)
    assert not [read for read in store.fs.reads if read[0] == sliced_file]  # not read whole, nor at all yet
    kernel = from_files(files, ranged_files(info.manifest.fields))[0]["model"]["kernel"]
    # Rows 4..8, columns 3..6 (a device of a (2, 3) mesh): only slices 2 and 3 are read, each by its own range.
    np.testing.assert_array_equal(kernel.region((slice(4, 8), slice(3, 6))), WHOLE[4:8, 3:6])
    ranges = [(start, end) for name, start, end in store.fs.reads if name == sliced_file]
    assert ranges == [(e[4]["offset"], e[4]["offset"] + e[4]["nbytes"]) for e in entries[2:]]
    # Within kept(), regions that overlap one slice read it once (a variable placed on several devices).
    store.fs.reads.clear()
    with kernel.kept():
        for columns in (slice(0, 3), slice(3, 6)):
            np.testing.assert_array_equal(kernel.region((slice(0, 2), columns)), WHOLE[0:2, columns])
    assert [start for name, start, _ in store.fs.reads if name == sliced_file] == [entries[0][4]["offset"]]
    np.testing.assert_array_equal(np.asarray(kernel), WHOLE)


def test_a_corrupt_slice_is_an_error_naming_it_when_it_is_read_and_the_others_still_read(tmp_path):
    from ktrainer.checkpoint.io import CheckpointError
    from ktrainer.checkpoint.slices import ranged_files

    store = _saved_through_storage(tmp_path)
    info = store.read("step-00000001")[0]
    (sliced_file,) = ranged_files(info.manifest.fields)
    second = info.manifest.fields["slices"][sliced_file][1]
    path = tmp_path / "step-00000001" / sliced_file
    data = bytearray(path.read_bytes())
    data[second[4]["offset"] + 5] ^= 0x01  # one bit of slice 1 (rows 2..4); the size stays the same
    path.write_bytes(bytes(data))
    info, files = store.read("step-00000001")  # the file of slices is not read whole: the damage is not seen yet
    kernel = from_files(files, ranged_files(info.manifest.fields))[0]["model"]["kernel"]
    np.testing.assert_array_equal(kernel.region((slice(0, 2), slice(None))), WHOLE[0:2])
    with pytest.raises(CheckpointError, match=r"slice model/kernel@1 does not match its crc32c checksum \(corrupt\)"):
        kernel.region((slice(2, 4), slice(None)))
