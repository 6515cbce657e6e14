"""One evaluation run: exactly the batches asked for whatever steps_per_execution, means over every example,
metric objects reset per run, and each kind's hooks."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.both_backends


def _fitted(quiet, **settings) -> tuple[kt.Trainer, Regressor]:
    module = Regressor()
    trainer = kt.Trainer(max_steps=2, batch_size=16, **settings, **quiet)
    trainer.fit(module, regression_data(n=32))
    return trainer, module


def _mse(module: Regressor, x: np.ndarray, y: np.ndarray) -> float:
    prediction = keras.ops.convert_to_numpy(module.model(x))[:, 0]
    return float(np.mean((prediction.astype(np.float64) - y) ** 2))


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_validation_runs_exactly_the_limited_batches(quiet, steps_per_execution):
    trainer, module = _fitted(quiet, steps_per_execution=steps_per_execution, limit_val_batches=5)
    x, y = regression_data(n=16 * 7, seed=3)
    metrics = trainer.validate(module, (x, y))
    assert metrics["val/loss"] == pytest.approx(_mse(module, x[:80], y[:80]), rel=1e-5)


def test_a_ragged_last_batch_weighs_by_its_examples(quiet):
    trainer, module = _fitted(quiet, steps_per_execution=2)
    x, y = regression_data(n=37, seed=4)  # 16 + 16 + 5
    metrics = trainer.validate(module, (x, y))
    assert metrics["val/loss"] == pytest.approx(_mse(module, x, y), rel=1e-5)


class WithMetric(Regressor):
    """Logs a keras metric object in validation, and counts the epoch hooks that ran."""

    def __init__(self):
        super().__init__()
        self.hooks = []

    def build(self):
        self.mae = keras.metrics.MeanAbsoluteError()
        return super().build()

    def validation_step(self, batch):
        x, y = batch
        prediction = self.model(x)[:, 0]
        self.mae.update_state(y, prediction)
        self.log("val/mae", self.mae)
        return keras.ops.mean(keras.ops.square(prediction - y))

    def on_validation_epoch_start(self):
        self.hooks.append("start")

    def on_validation_epoch_end(self):
        self.hooks.append("end")


def test_metric_objects_start_afresh_each_run_so_two_runs_agree(quiet):
    module = WithMetric()
    trainer = kt.Trainer(max_steps=1, batch_size=16, **quiet)
    trainer.fit(module, regression_data(n=32))
    data = regression_data(n=48, seed=5)
    first, second = trainer.validate(module, data), trainer.validate(module, data)
    x, y = data
    prediction = keras.ops.convert_to_numpy(module.model(x))[:, 0]
    assert first["val/mae"] == pytest.approx(float(np.mean(np.abs(prediction - y))), rel=1e-5)
    assert second == pytest.approx(first)
    assert module.hooks == ["start", "end", "start", "end"]
