"""LearningRateMonitor: the rate a schedule gives at each logged step reaches the loggers."""

from __future__ import annotations

import keras
import pytest

import ktrainer as kt
from ktrainer.precision import MixedPrecision
from tests.helpers import Classifier, read_scalars

pytestmark = pytest.mark.both_backends


class Scheduled(Classifier):
    def configure_optimizers(self):
        schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
        return keras.optimizers.SGD(schedule)


def test_schedule_values_are_logged_at_each_log_step(tmp_path):
    trainer = kt.Trainer(max_steps=4, batch_size=32, log_every_n_steps=2, default_root_dir=str(tmp_path),
                         enable_progress_bar=False)
    trainer.fit(Scheduled())
    scalars = read_scalars(str(tmp_path / "tensorboard" / "version_0"))
    # After 2 and 4 optimizer steps the schedule gives 0.1 * 0.5**2 and 0.1 * 0.5**4.
    assert scalars["lr-SGD"] == [(2, pytest.approx(0.025)), (4, pytest.approx(0.00625))]


@pytest.mark.parametrize(("steps_per_execution", "accumulate"), [(3, 1), (4, 2)])
def test_several_steps_per_execution_log_each_steps_rate_as_one_per_execution_does(tmp_path, steps_per_execution,
                                                                                      accumulate):
    def logged(root, **arguments):
        kt.Trainer(max_steps=5, batch_size=16, log_every_n_steps=1, accumulate_grad_batches=accumulate,
                   default_root_dir=str(root), enable_progress_bar=False, **arguments).fit(Scheduled())
        return read_scalars(str(root / "tensorboard" / "version_0"))["lr-SGD"]

    expected = [(step, pytest.approx(0.1 * 0.5**step)) for step in range(1, 6)]
    assert logged(tmp_path / "one") == expected
    assert logged(tmp_path / "several", steps_per_execution=steps_per_execution) == expected


def test_skipped_steps_within_an_execution_leave_the_rate_where_one_per_execution_leaves_it(tmp_path):
    def logged(root, steps_per_execution):
        precision = MixedPrecision("16-mixed", initial_scale=2.0**40)  # the first steps overflow and are skipped
        trainer = kt.Trainer(max_steps=6, batch_size=16, log_every_n_steps=1, precision=precision,
                             steps_per_execution=steps_per_execution, default_root_dir=str(root),
                             enable_progress_bar=False)
        trainer.fit(Scheduled())
        assert trainer.skipped_steps > 0
        return read_scalars(str(root / "tensorboard" / "version_0"))["lr-SGD"]

    one = logged(tmp_path / "one", 1)
    assert [step for step, _ in one] == [1, 2, 3, 4, 5, 6] and one[0][1] == pytest.approx(0.1)  # step 1: skipped
    assert logged(tmp_path / "several", 4) == [(step, pytest.approx(rate)) for step, rate in one]


def test_epoch_interval(tmp_path):
    monitor = kt.callbacks.LearningRateMonitor(logging_interval="epoch")
    trainer = kt.Trainer(max_epochs=2, batch_size=64, callbacks=[monitor], default_root_dir=str(tmp_path),
                         enable_progress_bar=False)
    trainer.fit(Scheduled())
    scalars = read_scalars(str(tmp_path / "tensorboard" / "version_0"))
    assert scalars["lr-SGD"] == [(0, pytest.approx(0.1)), (4, pytest.approx(0.1 * 0.5**4))]


def test_bad_interval():
    with pytest.raises(ValueError, match="logging_interval='batch' is not supported"):
        kt.callbacks.LearningRateMonitor("batch")
