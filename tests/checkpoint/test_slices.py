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
