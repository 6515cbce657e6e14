"""Retention over hand-made listings: what is kept, and that nothing but this callback's own is ever deleted."""

from __future__ import annotations

import pytest

from ktrainer.checkpoint.format import checkpoint_name
from ktrainer.checkpoint.retention import Entry, Retention
from ktrainer.checkpoint.retention import to_delete as _to_delete

pytestmark = pytest.mark.both_backends

ME = "ModelCheckpoint{'dirpath': 'runs'}"
OTHER = "ModelCheckpoint{'dirpath': 'other'}"
RUN, PARENT, STRANGER = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"


def to_delete(entries, rules, *, owner, lineage=(RUN,), **kwargs):
    """Retention as the callback of run RUN applies it (unless another lineage is given)."""
    return _to_delete(entries, rules, owner=owner, lineage=lineage, **kwargs)


def ckpt(step: int, committed: float | None = None, **kwargs) -> Entry:
    """An owned, complete checkpoint at `step` committed by run RUN at `committed` (default: the step)."""
    kwargs.setdefault("owner", ME)
    kwargs.setdefault("run_id", RUN)
    return Entry(checkpoint_name(step), step, float(step if committed is None else committed), **kwargs)


def leftover(step: int, *run_ids: str) -> Entry:
    """An interrupted save: a directory with files but no manifest."""
    return Entry(checkpoint_name(step), step, has_manifest=False, complete=False, owner=None,
                 run_ids=frozenset(run_ids))


def names(*steps: int) -> list[str]:
    return [checkpoint_name(step) for step in steps]


def test_the_newest_by_commit_order_are_kept():
    entries = [ckpt(step) for step in range(1, 7)]
    assert to_delete(entries, Retention(max_to_keep=3), owner=ME) == names(1, 2, 3)


def test_newest_means_committed_last_not_highest_step():
    # Steps 1, 2 and 4 were saved; then a run resumed from step 2 and its branch saved step 3: committed last, it is
    # the newest although step 4 is higher.
    entries = [ckpt(1, 10.0), ckpt(2, 20.0), ckpt(4, 40.0), ckpt(3, 50.0)]
    assert to_delete(entries, Retention(max_to_keep=1), owner=ME) == names(1, 2, 4)
    assert to_delete(entries, Retention(max_to_keep=2), owner=ME) == names(1, 2)


def test_equal_commit_times_fall_back_to_the_step():
    entries = [ckpt(5, 1.0), ckpt(3, 1.0), ckpt(4, 1.0)]
    assert to_delete(entries, Retention(max_to_keep=1), owner=ME) == names(3, 4)


def test_max_to_keep_none_keeps_everything():
    entries = [ckpt(step) for step in range(1, 10)]
    assert to_delete(entries, Retention(max_to_keep=None), owner=ME) == []


def test_the_best_k_are_kept_in_min_mode():
    metrics = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.2, 5: 0.8, 6: 0.7}
    entries = [ckpt(step, metric=value) for step, value in metrics.items()]
    # newest one (6) + the two lowest (2, 4)
    assert to_delete(entries, Retention(max_to_keep=1, save_top_k=2, mode="min"), owner=ME) == names(1, 3, 5)


def test_the_best_k_are_kept_in_max_mode():
    metrics = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.2, 5: 0.8, 6: 0.7}
    entries = [ckpt(step, metric=value) for step, value in metrics.items()]
    # newest one (6) + the two highest (1, 5)
    assert to_delete(entries, Retention(max_to_keep=1, save_top_k=2, mode="max"), owner=ME) == names(2, 3, 4)


def test_checkpoints_without_the_metric_are_not_ranked():
    entries = [ckpt(1), ckpt(2, metric=0.5), ckpt(3), ckpt(4)]
    assert to_delete(entries, Retention(max_to_keep=1, save_top_k=2), owner=ME) == names(1, 3)


def test_milestones_are_kept_forever():
    entries = [ckpt(step) for step in range(100, 1100, 100)]
    kept = Retention(max_to_keep=2, keep_every_n_steps=500)
    assert to_delete(entries, kept, owner=ME) == names(100, 200, 300, 400, 600, 700, 800)


def test_protected_names_are_never_deleted():
    entries = [ckpt(step) for step in range(1, 6)]
    deleted = to_delete(entries, Retention(max_to_keep=1), owner=ME, protected=names(2, 3))
    assert deleted == names(1, 4)


def test_a_protected_checkpoint_is_kept_even_when_incomplete():
    entries = [ckpt(1, complete=False), ckpt(2)]
    assert to_delete(entries, Retention(max_to_keep=1), owner=ME, protected=names(1)) == []


@pytest.mark.parametrize("foreign", [
    {"owner": OTHER},
    {"owner": None},
    {"owner": None, "complete": False},  # an unparsable manifest: whose it is cannot be known
    {"symlink": True},
    {"known_format": False},
    {"known_format": False, "complete": False},
])
def test_only_own_complete_format_checkpoints_reached_directly_are_deleted(foreign):
    old = ckpt(1, **foreign)
    entries = [old] + [ckpt(step) for step in range(2, 6)]
    assert to_delete(entries, Retention(max_to_keep=1), owner=ME) == names(2, 3, 4)


def test_foreign_checkpoints_do_not_count_towards_max_to_keep():
    entries = [ckpt(1), ckpt(2), ckpt(3, owner=OTHER), ckpt(4, owner=OTHER), ckpt(5, symlink=True)]
    assert to_delete(entries, Retention(max_to_keep=2), owner=ME) == []


def test_incomplete_owned_checkpoints_are_deleted_and_do_not_take_a_place():
    # Step 5 is the newest commit but its files are missing: it neither survives nor displaces a complete one.
    entries = [ckpt(1), ckpt(2), ckpt(3), ckpt(5, complete=False)]
    assert to_delete(entries, Retention(max_to_keep=2), owner=ME) == names(1, 5)


def test_incomplete_owned_checkpoints_are_not_ranked_or_kept_as_milestones():
    entries = [ckpt(10, complete=False, metric=0.0), ckpt(20), ckpt(30)]
    rules = Retention(max_to_keep=1, save_top_k=1, keep_every_n_steps=10)
    assert to_delete(entries, rules, owner=ME) == names(10)


def test_leftovers_written_only_by_the_lineage_are_deleted():
    entries = [ckpt(1), leftover(2, RUN), leftover(3, PARENT, RUN), leftover(4, PARENT)]
    assert to_delete(entries, Retention(max_to_keep=3), owner=ME, lineage=[PARENT, RUN]) == names(2, 3, 4)


@pytest.mark.parametrize("run_ids", [(), (STRANGER,), (RUN, STRANGER)], ids=["no-run-ids", "foreign", "mixed"])
def test_leftovers_not_written_only_by_the_lineage_are_kept(run_ids):
    entries = [leftover(2, *run_ids), ckpt(3)]
    assert to_delete(entries, Retention(max_to_keep=1), owner=ME, lineage=[PARENT, RUN]) == []


def test_leftovers_are_kept_without_a_lineage():
    assert to_delete([leftover(2, RUN)], Retention(), owner=ME, lineage=()) == []


def test_a_leftover_reached_through_a_symlink_or_protected_is_kept():
    link = Entry(checkpoint_name(2), 2, has_manifest=False, complete=False, symlink=True, run_ids=frozenset({RUN}))
    entries = [link, leftover(3, RUN)]
    assert to_delete(entries, Retention(), owner=ME, protected=names(3), lineage=[RUN]) == []


def test_the_result_follows_the_listing_order():
    entries = [ckpt(5), leftover(9, RUN), ckpt(1), ckpt(7), ckpt(3), ckpt(8)]
    assert to_delete(entries, Retention(max_to_keep=1), owner=ME, lineage=[RUN]) == names(5, 9, 1, 7, 3)


def test_the_listing_can_be_any_iterable():
    entries = (ckpt(step) for step in range(1, 4))
    assert to_delete(entries, Retention(max_to_keep=1), owner=ME) == names(1, 2)


def test_a_nan_metric_does_not_displace_the_best():
    nan = float("nan")
    entries = [ckpt(2, metric=0.5), ckpt(1, metric=nan), ckpt(3, metric=0.1), ckpt(4, metric=0.9)]
    assert checkpoint_name(3) not in to_delete(entries, Retention(max_to_keep=1, save_top_k=1), owner=ME)


def test_checkpoints_of_an_unrelated_run_in_the_same_directory_are_never_deleted():
    # A month-long run kept 998-1000; the script was started again without resuming: a new run.
    theirs = [ckpt(step, run_id=STRANGER) for step in (998, 999, 1000)]
    mine = [ckpt(step, 2000.0 + step) for step in (1, 2, 3, 4)]
    assert to_delete(theirs + mine, Retention(max_to_keep=1), owner=ME) == names(1, 2, 3)


def test_checkpoints_of_the_runs_this_one_continues_are_managed_like_its_own():
    parent = [ckpt(step, run_id=PARENT) for step in (10, 20, 30)]
    mine = [ckpt(step, 100.0 + step) for step in (21, 22)]
    deleted = to_delete(parent + mine, Retention(max_to_keep=2), owner=ME, lineage=(PARENT, RUN),
                        protected=names(20))
    assert deleted == names(10, 30)  # 20 is the one this run resumed from; 30, the abandoned branch, is older
