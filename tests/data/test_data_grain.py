"""Grain datasets as training data: a batched `grain.MapDataset` or `IterDataset` is an iterable of batches, trains
as the same numpy data in the same order does, and resumes mid-epoch exactly."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from tests.helpers import Regressor, regression_data

grain = pytest.importorskip("grain")

pytestmark = pytest.mark.both_backends


def _dataset(x: np.ndarray, y: np.ndarray) -> grain.MapDataset:
    return grain.MapDataset.source(list(zip(x, y, strict=True))).batch(16)


def _weights(module: Regressor) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v) for v in module.model.weights]


@pytest.mark.parametrize("iterable", [False, True], ids=["map-dataset", "iter-dataset"])
def test_a_grain_dataset_trains_as_the_same_numpy_batches_in_order(quiet, iterable):
    x, y = regression_data(n=64)
    data = _dataset(x, y).to_iter_dataset() if iterable else _dataset(x, y)
    from_grain, from_numpy = Regressor(), Regressor()
    trainer = kt.Trainer(max_epochs=2, batch_size=16, seed=0, **quiet)
    trainer.fit(from_grain, data)
    kt.Trainer(max_epochs=2, batch_size=16, seed=0, **quiet).fit(from_numpy, (x, y), shuffle=False)
    assert (trainer.global_step, trainer.current_epoch) == (8, 2)
    for a, b in zip(_weights(from_grain), _weights(from_numpy), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-7)


def test_a_run_on_grain_data_resumed_mid_epoch_continues_exactly(tmp_path, quiet):
    x, y = regression_data(n=64)
    straight = Regressor(optimizer="adam")
    kt.Trainer(max_epochs=2, batch_size=16, seed=0, **quiet).fit(straight, _dataset(x, y))
    root = str(tmp_path / "run")
    kt.Trainer(max_steps=3, batch_size=16, seed=0, default_root_dir=root, **quiet).fit(Regressor(optimizer="adam"),
                                                                                       _dataset(x, y))
    resumed = Regressor(optimizer="adam")
    trainer = kt.Trainer(max_epochs=2, batch_size=16, seed=0, default_root_dir=root, **quiet)
    trainer.fit(resumed, _dataset(x, y), ckpt_path="last")
    assert trainer.global_step == 8
    for a, b in zip(_weights(straight), _weights(resumed), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
