"""A generator as data is one stream, as Keras's `fit` reads it: nothing lost to the Trainer looking at its first
batch, each epoch the next `limit_train_batches` batches, validation read the same way, and the same weights as the
same batches given as numpy."""

from __future__ import annotations

import numpy as np
import pytest

import ktrainer as kt
from ktrainer.data.streams import Stream, is_one_shot
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


class Restarting:
    """An iterator class whose __iter__ starts a new pass (a common loader pattern)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y, self.start = x, y, 0

    def __iter__(self):
        self.start = 0
        return self

    def __next__(self):
        if self.start >= len(self.y):
            raise StopIteration
        self.start += BATCH
        return self.x[self.start - BATCH:self.start], self.y[self.start - BATCH:self.start]


def test_only_a_one_shot_iterator_is_a_stream_and_deciding_calls_nothing():
    assert is_one_shot(iter([1])) and is_one_shot(x for x in [1]) and is_one_shot(map(int, "12"))
    assert not is_one_shot([1]) and not is_one_shot(range(3)) and not is_one_shot(5)
    restarting = Restarting(*regression_data(32))
    restarting.start = 16
    assert not is_one_shot(restarting) and restarting.start == 16  # its own __iter__ may start a new pass


@pytest.mark.parametrize(("data", "reading", "as_numpy"), [
    # a generator over two epochs trains on every batch once, in order: one epoch of the same 8 batches
    (lambda x, y: batches(x, y), {"max_epochs": 2, "limit_train_batches": 4}, {"max_epochs": 1}),
    # a generator read to its end in one epoch is every batch
    (lambda x, y: batches(x, y), {"max_epochs": 1}, {"max_epochs": 1}),
    # an iterator class whose __iter__ starts a new pass is read anew each epoch
    (lambda x, y: Restarting(x, y), {"max_epochs": 2}, {"max_epochs": 2}),
], ids=["generator_two_epochs", "generator_to_its_end", "restarting_class"])
def test_the_same_weights_as_the_same_batches_given_as_numpy(data, reading, as_numpy):
    x, y = regression_data(128)
    np.testing.assert_allclose(trained(data(x, y), **reading), trained((x, y), **as_numpy), rtol=1e-6, atol=1e-7)


def test_a_generator_that_ran_out_says_how_to_end_the_run_there():
    x, y = regression_data(64)
    with pytest.raises(ValueError, match=r"train_data, a generator, ran out after 1 epoch: .* Set max_epochs=1"):
        trained(batches(x, y), max_epochs=2)


def test_a_generator_resumed_anew_continues_where_the_interrupted_run_stopped(tmp_path):
    x, y = regression_data(128)

    def run(max_steps=None, ckpt_path=None) -> tuple[kt.Trainer, np.ndarray]:
        module = Regressor()
        trainer = kt.Trainer(max_epochs=2, max_steps=max_steps, limit_train_batches=4, batch_size=BATCH,
                             enable_progress_bar=False, logger=False, default_root_dir=str(tmp_path))
        trainer.fit(module, train_data=batches(x, y), shuffle=False, ckpt_path=ckpt_path)
        return trainer, module.model.get_weights()[0]

    run(max_steps=6)  # stops in the second epoch, after batch 5 of the stream
    resumed, weights = run(ckpt_path="last")
    assert resumed.global_step == 8
    np.testing.assert_allclose(weights, trained((x, y), max_epochs=1), rtol=1e-6, atol=1e-7)


def test_a_validation_generator_loses_no_batch_to_being_looked_at():
    x, y = regression_data(64)
    vx, vy = regression_data(48, seed=1)
    module = Regressor()
    trainer = kt.Trainer(max_epochs=1, batch_size=BATCH, limit_val_batches=3, enable_progress_bar=False,
                         logger=False, enable_checkpointing=False)
    trainer.fit(module, train_data=(x, y), val_data=batches(vx, vy), shuffle=False)
    in_fit = trainer.callback_metrics["val/loss"]
    assert in_fit == pytest.approx(trainer.validate(module, (vx, vy))["val/loss"], rel=1e-6)


def test_a_validation_generator_without_a_batch_count_is_refused_before_training(tmp_path):
    x, y = regression_data(64)
    trainer = kt.Trainer(max_epochs=2, batch_size=BATCH, enable_progress_bar=False, logger=False,
                         default_root_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"val_data is a generator, read as one stream: .* Set limit_val_batches=N"):
        trainer.fit(Regressor(), train_data=(x, y), val_data=batches(*regression_data(32, seed=1)))
    assert trainer.global_step == 0 and not (tmp_path / "checkpoints").exists()


class ValidationSeen(kt.callbacks.Callback):
    """Keeps the weights and the val/loss of each validation."""

    def __init__(self) -> None:
        self.seen: list[tuple[list, float]] = []

    def on_validation_end(self, trainer, module):
        self.seen.append((module.model.get_weights(), trainer.callback_metrics["val/loss"]))


def test_each_validation_takes_the_next_batches_of_a_validation_generator():
    x, y = regression_data(64)
    vx, vy = regression_data(32, seed=1)
    seen = ValidationSeen()
    kt.Trainer(max_epochs=2, limit_val_batches=1, batch_size=BATCH, enable_progress_bar=False, logger=False,
               enable_checkpointing=False, callbacks=[seen]).fit(Regressor(), train_data=(x, y),
                                                               val_data=batches(vx, vy), shuffle=False)
    assert len(seen.seen) == 2
    for index, ((kernel, bias), loss) in enumerate(seen.seen):
        part = slice(index * BATCH, (index + 1) * BATCH)
        expected = np.mean((vx[part] @ kernel[:, 0] + bias[0] - vy[part]) ** 2)
        assert loss == pytest.approx(float(expected), rel=1e-5)


def test_validating_on_a_generator_that_has_ended_is_an_error_not_a_silent_nan():
    x, y = regression_data(32)
    module, ended = Regressor(), batches(x, y)
    trainer = kt.Trainer(batch_size=BATCH, enable_progress_bar=False, logger=False)
    trainer.validate(module, ended)
    with pytest.raises(ValueError, match="val_data yielded no batch: it is empty, or a generator that has already"):
        trainer.validate(module, ended)
