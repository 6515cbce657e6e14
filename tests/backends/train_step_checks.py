"""What the engines' training-step tests share: a Regressor prepared on an engine, one SGD step by hand, and the
check that a saved partial accumulation group restores into a new step and flushes as its mean."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ktrainer.data.sources import BatchSource
from ktrainer.precision import Precision
from ktrainer.trainer.building import build_model, build_optimizers
from tests.helpers import Regressor, regression_data

LR = 0.1


class PreparedStep:
    """A Regressor (zero weights, SGD(0.1)) built on `engine`, its training step prepared on 8 examples in batches
    of `batch_size`."""

    def __init__(self, engine: Any, module: Regressor | None = None, accumulate: int = 1,
                 batch_size: int = 8) -> None:
        self.module = module or Regressor(lr=LR)
        self.engine = engine
        self.engine.start()
        precision = Precision()
        build_model(self.module, precision, [], self.engine)
        built = build_optimizers(self.module, precision, self.engine, None)
        self.step = self.engine.train_step(self.module, built.wrapped, built.configured, precision,
                                           gradient_clip_val=None, accumulate_grad_batches=accumulate)
        self.x, self.y = regression_data(8)
        self.source = BatchSource((self.x, self.y), batch_size)
        self.keys = self.engine.prepare_train_step(self.step, self.source)

    def kernel(self) -> np.ndarray:
        """The Dense kernel as the Keras variable holds it."""
        return np.asarray(self.module.model.layers[-1].kernel.value)


def sgd_from_zero(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The kernel after one SGD step on mean((x @ w + b - y)^2) from w = 0, b = 0."""
    return (LR * 2.0 * x.T @ y / len(y))[:, None]


def check_a_saved_group_restores_and_flushes_as_its_mean(saved_from: PreparedStep,
                                                         make: Callable[[], PreparedStep]) -> None:
    """`saved_from` holds a partial group of two batches (the two halves of its 8 examples), nothing applied yet:
    saved, restored into a new step and flushed, it is one SGD step on all 8 examples."""
    assert saved_from.step.pending() == 2
    saved_from.engine.sync()
    assert not np.any(saved_from.kernel())
    saved = saved_from.step.state_dict()
    assert list(saved) == ["00"]
    resumed = make()
    assert resumed.step.mismatch(saved) == ""
    resumed.step.load_state_dict(saved)
    assert resumed.step.pending() == 2
    assert resumed.step.flush() == (True, False)
    resumed.engine.sync()
    np.testing.assert_allclose(resumed.kernel(), sgd_from_zero(saved_from.x, saved_from.y), rtol=1e-5, atol=1e-7)
    assert resumed.step.pending() == 0 and resumed.step.state_dict() == {}
    assert resumed.step.flush() == (False, False)
