"""The Schedule: when the loop stops, how many batches the next compiled call runs, when it validates and logs."""

from __future__ import annotations

import numpy as np
import pytest

from ktrainer.progress import Progress
from ktrainer.schedule import Schedule

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
