"""A generator as data is one stream, as Keras's `fit` reads it: nothing lost to the Trainer looking at its first
batch, each epoch the next `limit_train_batches` batches, validation read the same way, and the same weights as the
same batches given as numpy."""

from __future__ import annotations

import numpy as np
import pytest

import ktrainer as kt
from ktrainer.streams import Stream, is_one_shot
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.both_backends

BATCH = 16


def batches(x: np.ndarray, y: np.ndarray):
    """A generator of consecutive batches of 16, as a user writes one."""
    for start in range(0, len(y), BATCH):
        yield x[start:start + BATCH], y[start:start + BATCH]


def trained(train_data, **arguments) -> np.ndarray:
    module = Regressor()
    kt.Trainer(batch_size=BATCH, enable_progress_bar=False, logger=False, enable_checkpointing=False,
               **arguments).fit(module, train_data=train_data, shuffle=False)
    return module.model.get_weights()[0]


def test_what_is_looked_at_ahead_is_read_again_in_order():
    stream = Stream(iter(range(5)))
    assert next(stream.look_ahead()) == 0
    ahead = stream.look_ahead()
    assert [next(ahead), next(ahead)] == [0, 1]
    reader = iter(stream)
    assert [next(reader), next(reader), next(reader)] == [0, 1, 2]
    assert list(iter(stream)) == [3, 4]  # a new reader continues the stream
    assert list(stream.look_ahead()) == [] and list(iter(stream)) == []


def test_only_a_one_shot_iterator_is_a_stream():
    assert is_one_shot(iter([1])) and is_one_shot(x for x in [1])
    assert not is_one_shot([1]) and not is_one_shot(range(3)) and not is_one_shot(5)


def test_a_generator_over_two_epochs_trains_on_every_batch_once_in_order_as_numpy_does():
    x, y = regression_data(128)
    expected = trained((x, y), max_epochs=1)  # 8 batches of 16, in order
    np.testing.assert_allclose(trained(batches(x, y), max_epochs=2, limit_train_batches=4), expected,
                               rtol=1e-6, atol=1e-7)


def test_a_generator_read_to_its_end_in_one_epoch_is_every_batch():
    x, y = regression_data(128)
    np.testing.assert_allclose(trained(batches(x, y), max_epochs=1), trained((x, y), max_epochs=1),
                               rtol=1e-6, atol=1e-7)


def test_a_generator_that_has_ended_leaves_the_next_epoch_nothing_and_says_so():
    x, y = regression_data(64)
    with pytest.raises(ValueError, match="a generator is read as one stream across epochs and had ended"):
        trained(batches(x, y), max_epochs=2)


def test_a_validation_generator_loses_no_batch_to_being_looked_at():
    x, y = regression_data(64)
    vx, vy = regression_data(48, seed=1)
    module = Regressor()
    trainer = kt.Trainer(max_epochs=1, batch_size=BATCH, enable_progress_bar=False, logger=False,
                         enable_checkpointing=False)
    trainer.fit(module, train_data=(x, y), val_data=batches(vx, vy), shuffle=False)
    in_fit = trainer.callback_metrics["val/loss"]
    assert in_fit == pytest.approx(trainer.validate(module, (vx, vy))["val/loss"], rel=1e-6)
