"""The Schedule: when the loop stops, how many batches the next compiled call runs, when it validates and logs."""

from __future__ import annotations

import numpy as np
import pytest

from ktrainer.progress import Progress
from ktrainer.schedule import Schedule, check_validation_rhythm

pytestmark = pytest.mark.both_backends


def at(step: int = 0, epoch: int = 0, batch: int = 0) -> Progress:
    return Progress(global_step=step, epoch=epoch, batch_in_epoch=batch)


def test_it_is_finished_at_either_limit():
    schedule = Schedule(max_epochs=2, max_steps=10, batches_per_epoch=8)
    assert not schedule.finished(at(step=9, epoch=1))
    assert schedule.finished(at(step=10, epoch=1))
    assert schedule.finished(at(step=3, epoch=2))
    assert not Schedule(max_epochs=None, max_steps=None, batches_per_epoch=None).finished(at(step=10**6, epoch=99))


def test_an_execution_ends_at_the_epoch_end_and_at_max_steps():
    schedule = Schedule(max_epochs=None, max_steps=10, batches_per_epoch=8, steps_per_execution=5)
    assert schedule.batches_in_next_execution(at(batch=0)) == 5
    assert schedule.batches_in_next_execution(at(step=5, batch=5)) == 3  # the epoch ends after batch 8
    assert schedule.batches_in_next_execution(at(step=8, epoch=1, batch=0)) == 2  # max_steps=10
    assert schedule.batches_in_next_execution(at(step=10, epoch=1, batch=2)) == 0


def test_what_the_next_call_may_take_is_nothing_after_the_epochs_last_call_or_at_max_steps():
    schedule = Schedule(max_epochs=None, max_steps=10, batches_per_epoch=8, steps_per_execution=5)
    assert schedule.batches_after(at(batch=0), 5) == 3  # the epoch ends after batch 8
    assert schedule.batches_after(at(step=5, batch=5), 3) == 0  # that call ends the epoch
    assert schedule.batches_after(at(step=8, epoch=1, batch=0), 2) == 0  # that call reaches max_steps=10
    endless = Schedule(max_epochs=None, max_steps=None, batches_per_epoch=None, steps_per_execution=4)
    assert endless.batches_after(at(step=100, batch=100), 4) == 4
    grouped = Schedule(max_epochs=None, max_steps=3, batches_per_epoch=None, steps_per_execution=16,
                       accumulate_grad_batches=4)
    assert grouped.batches_after(at(), 4) == 8  # two more groups of 4
    assert grouped.batches_after(at(), 12) == 0
    assert grouped.batches_after(at(step=2, batch=9), 3) == 0  # that call finishes step 3's group
    validating = Schedule(max_epochs=1, max_steps=None, batches_per_epoch=10, steps_per_execution=5,
                          val_check_interval=3, check_val_every_n_epoch=1)
    assert validating.batches_after(at(), 3) == validating.batches_in_next_execution(at(step=3, batch=3)) == 3


def test_with_accumulation_max_steps_counts_groups_and_a_partial_group_is_finished():
    schedule = Schedule(max_epochs=None, max_steps=3, batches_per_epoch=None, steps_per_execution=16,
                        accumulate_grad_batches=4)
    assert schedule.batches_in_next_execution(at()) == 12
    assert schedule.batches_in_next_execution(at(step=2, batch=9)) == 3  # one batch into step 3's group


def test_several_processes_end_executions_at_group_boundaries():
    alone = Schedule(max_epochs=1, max_steps=None, batches_per_epoch=100, steps_per_execution=8,
                     accumulate_grad_batches=3)
    together = Schedule(max_epochs=1, max_steps=None, batches_per_epoch=100, steps_per_execution=8,
                        accumulate_grad_batches=3, whole_groups=True)
    assert alone.batches_in_next_execution(at(batch=1)) == 8
    assert together.batches_in_next_execution(at(batch=1)) == 2


def test_validation_within_the_epoch_by_count_or_fraction():
    by_count = Schedule(max_epochs=1, max_steps=None, batches_per_epoch=10, steps_per_execution=8,
                        val_check_interval=4)
    assert by_count.batches_in_next_execution(at(batch=1)) == 3  # stops at batch 4 to validate
    assert [b for b in range(1, 11) if by_count.validates_within_epoch(at(batch=b))] == [4, 8]  # 10: epoch end
    assert by_count.validates_at_epoch_end(at(epoch=0))
    by_fraction = Schedule(max_epochs=1, max_steps=None, batches_per_epoch=10, val_check_interval=0.25)
    assert by_fraction.val_interval_batches() == 2
    whole_epoch = Schedule(max_epochs=1, max_steps=None, batches_per_epoch=10, val_check_interval=1.0)
    assert whole_epoch.val_interval_batches() is None and not whole_epoch.validates_within_epoch(at(batch=10))


def test_validation_at_every_nth_epoch_end_or_never():
    every_third = Schedule(max_epochs=9, max_steps=None, batches_per_epoch=10, check_val_every_n_epoch=3)
    assert [e for e in range(9) if every_third.validates_at_epoch_end(at(epoch=e))] == [2, 5, 8]
    never = Schedule(max_epochs=9, max_steps=None, batches_per_epoch=10, check_val_every_n_epoch=None)
    assert not any(never.validates_at_epoch_end(at(epoch=e)) for e in range(9))


def test_log_steps_are_the_taken_steps_at_multiples_of_the_interval():
    schedule = Schedule(max_epochs=1, max_steps=None, batches_per_epoch=None, log_every_n_steps=2)
    stepped = np.array([True, False, True, True, False, True])  # accumulation: some batches end no step
    steps_after = np.array([1, 1, 2, 3, 3, 4])
    assert schedule.log_indices(stepped, steps_after) == [2, 5]


def test_every_nth_epoch_also_gates_the_validations_inside_it():
    schedule = Schedule(max_epochs=4, max_steps=None, batches_per_epoch=10, val_check_interval=0.5,
                        check_val_every_n_epoch=2)
    within = [(e, b) for e in range(4) for b in range(1, 11) if schedule.validates_within_epoch(at(epoch=e, batch=b))]
    assert within == [(1, 5), (3, 5)]
    assert [e for e in range(4) if schedule.validates_at_epoch_end(at(epoch=e))] == [1, 3]
    assert schedule.batches_in_next_execution(at(epoch=0, batch=2)) == 1  # not cut at batch 5: no validation there
    assert schedule.batches_in_next_execution(at(epoch=1, batch=2)) == 1
    wide = Schedule(max_epochs=4, max_steps=None, batches_per_epoch=10, steps_per_execution=8,
                    val_check_interval=5, check_val_every_n_epoch=2)
    assert wide.batches_in_next_execution(at(epoch=0, batch=2)) == 8
    assert wide.batches_in_next_execution(at(epoch=1, batch=2)) == 3


def run_batches(epoch: int, batch: int, trained: int) -> Progress:
    return Progress(epoch=epoch, batch_in_epoch=batch, batches_trained=trained)


def test_without_epoch_checks_an_int_interval_counts_the_batches_of_the_whole_run():
    schedule = Schedule(max_epochs=3, max_steps=None, batches_per_epoch=4, steps_per_execution=8,
                        val_check_interval=6, check_val_every_n_epoch=None)
    schedule.check_validation()  # more batches than an epoch holds is what this form is for
    positions = [(e, b) for e in range(3) for b in range(1, 5)]
    within = [(e, b) for e, b in positions if schedule.validates_within_epoch(run_batches(e, b, e * 4 + b))]
    ends = [e for e in range(3) if schedule.validates_at_epoch_end(run_batches(e, 4, e * 4 + 4))]
    assert (within, ends) == ([(1, 2)], [2])  # run batches 6 and 12; the one at an epoch's end runs there
    assert schedule.batches_in_next_execution(run_batches(1, 0, 4)) == 2  # cut at run batch 6


@pytest.mark.parametrize(("settings", "names"), [
    ({"val_check_interval": 11, "batches_per_epoch": 10}, ["val_check_interval=11", "10 training batches",
                                                          "check_val_every_n_epoch=None"]),
    ({"val_check_interval": 0.5, "batches_per_epoch": None}, ["val_check_interval=0.5", "not known",
                                                             "Give an int"]),
])
def test_a_rhythm_that_cannot_run_is_refused_saying_what_to_pass(settings, names):
    with pytest.raises(ValueError) as caught:
        Schedule(max_epochs=1, max_steps=None, **settings).check_validation()
    for name in names:
        assert name in str(caught.value)


def test_every_epoch_none_needs_an_int_interval_unless_validation_is_off():
    for interval in (None, 1.0, 0.5):
        with pytest.raises(ValueError, match="must be an int.*val_check_interval=N.*limit_val_batches=0"):
            check_validation_rhythm(interval, None)
    check_validation_rhythm(1, None)  # every batch
    check_validation_rhythm(None, None, limit_val_batches=0)
    check_validation_rhythm(0.5, 3)


def test_without_validation_data_nothing_validates_and_executions_are_not_cut():
    schedule = Schedule(max_epochs=2, max_steps=None, batches_per_epoch=None, steps_per_execution=8,
                        val_check_interval=None, check_val_every_n_epoch=None)
    schedule.check_validation()
    assert not schedule.validates_at_all() and not schedule.validates_once_per_epoch()
    assert schedule.batches_in_next_execution(at(batch=3)) == 8
    assert Schedule(max_epochs=1, max_steps=None, batches_per_epoch=8).validates_once_per_epoch()
    assert not Schedule(max_epochs=1, max_steps=None, batches_per_epoch=8,
                        check_val_every_n_epoch=2).validates_once_per_epoch()
