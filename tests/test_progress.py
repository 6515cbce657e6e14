"""Progress: where a run stands, saved and restored so that a resumed run continues exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ktrainer.progress import Progress, RunningSums, draw_seed

pytestmark = pytest.mark.both_backends


def mid_epoch() -> Progress:
    progress = Progress(global_step=1234, epoch=2, batch_in_epoch=34, skipped_steps=3, shuffle_seed=987)
    progress.epoch_sums.add({"loss": np.array([0.5, 0.25]), "acc": np.array([0.75, 1.0])}, np.array([32, 16]))
    return progress


def test_a_mid_epoch_state_round_trips_with_its_running_sums():
    saved = mid_epoch()
    state = json.loads(json.dumps(saved.state_dict()))  # it goes through the checkpoint's JSON
    restored = Progress()
    restored.load_state_dict(state)
    assert (restored.global_step, restored.epoch, restored.batch_in_epoch, restored.skipped_steps,
            restored.shuffle_seed) == (1234, 2, 34, 3, 987)
    assert restored.epoch_sums == saved.epoch_sums
    assert restored.epoch_sums.means() == pytest.approx({"loss": (0.5 * 32 + 0.25 * 16) / 48,
                                                          "acc": (0.75 * 32 + 1.0 * 16) / 48})
    assert restored.epoch_sums.steps == 2 and restored.epoch_sums.examples == 48
    assert not restored.epoch_done


def test_restored_sums_are_independent_of_the_saved_state():
    saved = mid_epoch()
    state = saved.state_dict()
    saved.epoch_sums.add({"loss": np.array([9.0])}, np.array([1]))
    restored = Progress()
    restored.load_state_dict(state)
    assert restored.epoch_sums.steps == 2


def test_a_done_epoch_is_saved_as_the_start_of_the_next():
    progress = mid_epoch()
    progress.pending_validation = True
    progress.epoch_done = True
    state = progress.state_dict()
    assert state["epoch"] == 3
    assert state["batch_in_epoch"] == 0
    assert state["epoch_sums"] is None
    assert state["pending_validation"] is False
    assert state["global_step"] == 1234 and state["skipped_steps"] == 3 and state["shuffle_seed"] == 987
    restored = Progress()
    restored.load_state_dict(state)
    restored.start_epoch()
    assert (restored.epoch, restored.batch_in_epoch) == (3, 0)
    assert restored.epoch_sums == RunningSums()


def test_the_start_of_an_epoch_saves_no_sums():
    state = Progress(global_step=10, epoch=1).state_dict()
    assert state["epoch_sums"] is None
    restored = Progress(epoch_sums=RunningSums({"loss": 5.0}, 1.0, 1))
    restored.load_state_dict(state)
    assert restored.epoch_sums == RunningSums()


def test_running_sums_give_means_weighted_by_batch_size():
    sums = RunningSums()
    assert sums.means() == {}
    sums.add({"loss": np.array([1.0, 3.0], np.float32)}, np.array([30, 10], np.int32))
    sums.add({"loss": np.array([2.0])}, np.array([20]))
    assert sums.means() == pytest.approx({"loss": (30 + 30 + 40) / 60})
    assert (sums.steps, sums.examples) == (3, 60.0)


def test_running_sums_of_a_partial_last_batch_do_not_bias_the_mean():
    sums = RunningSums()
    sums.add({"acc": np.array([1.0, 1.0, 0.0])}, np.array([64, 64, 8]))
    assert sums.means()["acc"] == pytest.approx(128 / 136)  # an unweighted mean would say 2/3


def test_running_sums_round_trip_through_their_state_dict():
    sums = RunningSums()
    sums.add({"a": np.array([0.1]), "b": np.array([-2.0])}, np.array([3]))
    assert RunningSums.from_state_dict(json.loads(json.dumps(sums.state_dict()))) == sums


def test_start_epoch_keeps_the_sums_when_resuming_mid_epoch():
    progress = mid_epoch()
    before = progress.epoch_sums
    progress.epoch_done = True
    progress.start_epoch()
    assert progress.epoch_sums is before
    assert not progress.epoch_done


def test_start_epoch_resets_the_sums_at_batch_zero():
    progress = mid_epoch()
    progress.batch_in_epoch = 0
    progress.start_epoch()
    assert progress.epoch_sums == RunningSums()
    assert progress.epoch_sums.means() == {}


def test_next_epoch_moves_on_with_fresh_sums():
    progress = mid_epoch()
    progress.epoch_done = True
    progress.next_epoch()
    assert (progress.epoch, progress.batch_in_epoch, progress.epoch_done) == (3, 0, False)
    assert progress.epoch_sums == RunningSums()
    assert progress.global_step == 1234


def test_pending_validation_is_saved():
    progress = mid_epoch()
    progress.pending_validation = True
    assert progress.state_dict()["pending_validation"] is True
    progress.pending_validation = False
    assert progress.state_dict()["pending_validation"] is False


@pytest.mark.parametrize("pending", [True, False])
def test_pending_validation_is_restored(pending):
    progress = mid_epoch()
    progress.pending_validation = pending
    restored = Progress(pending_validation=not pending)
    restored.load_state_dict(progress.state_dict())
    assert restored.pending_validation is pending


def test_draw_seed_is_a_non_negative_31_bit_integer():
    seeds = {draw_seed() for _ in range(8)}
    assert all(isinstance(seed, int) and 0 <= seed < 2**31 for seed in seeds)
    assert len(seeds) > 1


def test_the_runs_count_of_batches_is_saved_across_epochs_and_defaults_for_older_checkpoints():
    progress = mid_epoch()
    progress.batches_trained = 57
    state = progress.state_dict()
    progress.epoch_done = True
    assert state["batches_trained"] == progress.state_dict()["batches_trained"] == 57
    restored = Progress()
    restored.load_state_dict(state)
    assert restored.batches_trained == 57
    older = {key: value for key, value in state.items() if key != "batches_trained"}
    restored.load_state_dict(older)
    assert restored.batches_trained == state["batch_in_epoch"]
