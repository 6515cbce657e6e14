"""When a ModelCheckpoint saves, decided without storage: step and time triggers, epoch ends."""

from __future__ import annotations

from ktrainer.checkpoint.save_policy import SavePolicy, should_save


def test_a_step_trigger_saves_once_per_multiple_also_after_an_execution_jumped_past_it():
    policy = SavePolicy(every_n_train_steps=4)
    due = [should_save(policy, global_step=step, last_saved_step=-1, now=0.0, last_saved_time=0.0)
           for step in range(1, 6)]
    assert due == [None, None, None, "step", "step"]
    assert should_save(policy, global_step=6, last_saved_step=4, now=0.0, last_saved_time=0.0) is None
    assert should_save(policy, global_step=9, last_saved_step=4, now=0.0, last_saved_time=0.0) == "step"


def test_a_time_trigger_saves_when_the_interval_passed_on_the_runs_clock():
    policy = SavePolicy(train_time_interval=60.0)
    assert should_save(policy, global_step=3, last_saved_step=0, now=59.9, last_saved_time=0.0) is None
    assert should_save(policy, global_step=3, last_saved_step=0, now=60.0, last_saved_time=0.0) == "time"


def test_no_trigger_never_saves_at_a_batch_end_and_epochs_count_from_one():
    assert should_save(SavePolicy(every_n_epochs=1), global_step=100, last_saved_step=-1, now=1e9,
                       last_saved_time=0.0) is None
    every_second = SavePolicy(every_n_epochs=2)
    assert [every_second.epoch_due(epoch) for epoch in range(4)] == [False, True, False, True]
    assert not SavePolicy().epoch_due(0)
