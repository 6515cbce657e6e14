"""A run's identity: a fresh id for every fit, and a bounded lineage for a resumed one."""

from __future__ import annotations

import re

from ktrainer.checkpoint.lineage import MAX_LINEAGE, RunIdentity


def test_fresh_ids_are_12_hex_digits_and_differ():
    runs = [RunIdentity() for _ in range(50)]
    assert all(re.fullmatch(r"[0-9a-f]{12}", run.run_id) for run in runs)
    assert len({run.run_id for run in runs}) == len(runs)


def test_a_fresh_run_is_its_own_lineage_with_no_parent():
    run = RunIdentity()
    assert run.lineage == [run.run_id]
    assert run.parent is None
    assert run.parent_committed == 0.0


def test_a_resumed_run_keeps_its_id_and_names_its_parent():
    run = RunIdentity()
    resumed = run.resumed("file:///runs/checkpoints/step-00001200", 1234.5, ["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    assert resumed.run_id == run.run_id
    assert resumed.parent == "file:///runs/checkpoints/step-00001200"
    assert resumed.parent_committed == 1234.5
    assert resumed.lineage == ["aaaaaaaaaaaa", "bbbbbbbbbbbb", run.run_id]
    assert run.lineage == [run.run_id]  # the original identity is not changed


def test_a_resumed_lineage_is_bounded_and_keeps_the_newest_ancestors():
    run = RunIdentity()
    ancestors = [f"{index:012x}" for index in range(3 * MAX_LINEAGE)]
    resumed = run.resumed("memory://c/step-00000001", 1.0, ancestors)
    assert len(resumed.lineage) == MAX_LINEAGE
    assert resumed.lineage[-1] == run.run_id
    assert resumed.lineage[:-1] == ancestors[-(MAX_LINEAGE - 1):]


def test_resuming_again_and_again_never_grows_the_lineage_past_the_bound():
    lineage = []
    for _ in range(MAX_LINEAGE + 20):
        run = RunIdentity().resumed("memory://c/step-00000001", 1.0, lineage)
        assert len(run.lineage) <= MAX_LINEAGE
        assert run.lineage[-1] == run.run_id
        assert run.lineage[:-1] == lineage[-(MAX_LINEAGE - 1):]
        lineage = run.lineage
    assert len(lineage) == MAX_LINEAGE


def test_a_resumed_lineage_drops_the_own_id_and_non_strings_from_the_parent():
    run = RunIdentity()
    resumed = run.resumed("memory://c/step-00000001", 1.0, ["aaaaaaaaaaaa", run.run_id, None, 7, "bbbbbbbbbbbb"])
    assert resumed.lineage == ["aaaaaaaaaaaa", "bbbbbbbbbbbb", run.run_id]
    assert resumed.lineage.count(run.run_id) == 1


def test_an_explicit_lineage_is_kept():
    run = RunIdentity("0123456789ab", ["aaaaaaaaaaaa", "0123456789ab"])
    assert run.lineage == ["aaaaaaaaaaaa", "0123456789ab"]
