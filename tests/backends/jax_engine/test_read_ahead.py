"""Reading the next call's batches while the device runs this one: every batch is taken once, in the iterator's
order, whatever the calls ask for; a prepared form is reused only for exactly its batches; another iterator
starts afresh; an error of the iterator surfaces when the batch it stood for is taken, as without reading
ahead. End to end: a fit whose data fails trains exactly the batches before the failure.

Runs in the JAX session.
"""

from __future__ import annotations

import numpy as np
import pytest

import ktrainer as kt
from ktrainer.backends.jax.read_ahead import ReadAhead
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.jax_only


class Prepare:
    """Records what it prepared; the prepared form is the tuple of batches."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, batches):
        self.calls.append(tuple(batches))
        return tuple(batches)


def failing(good: int):
    yield from range(good)
    raise ValueError(f"batch {good} is corrupt")


def test_calls_of_any_size_take_every_batch_once_in_order():
    ahead, iterator, taken = ReadAhead(Prepare()), iter(range(20)), []
    for count in (3, 3, 1, 4, 2, 5, 5):
        batches, prepared = ahead.take(iterator, count)
        assert prepared == tuple(batches)
        taken += batches
        ahead.read(iterator, count)
    assert taken == list(range(20))
    assert ahead.take(iterator, 3) == ([], None)


def test_batches_read_ahead_are_prepared_once_and_taken_in_that_form():
    prepare = Prepare()
    ahead, iterator = ReadAhead(prepare), iter(range(10))
    ahead.take(iterator, 4)
    ahead.read(iterator, 4)
    assert prepare.calls == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert ahead.take(iterator, 4) == ([4, 5, 6, 7], (4, 5, 6, 7))
    assert len(prepare.calls) == 2  # taken as prepared, not prepared again


def test_a_shorter_call_leaves_the_rest_and_the_next_read_tops_it_up():
    prepare = Prepare()
    ahead, iterator = ReadAhead(prepare), iter(range(10))
    ahead.read(iterator, 4)
    assert ahead.take(iterator, 2) == ([0, 1], (0, 1))
    ahead.read(iterator, 4)
    assert prepare.calls[-1] == (2, 3, 4, 5)
    assert ahead.take(iterator, 4)[0] == [2, 3, 4, 5]


def test_another_iterator_drops_what_was_read_from_the_last():
    ahead, first = ReadAhead(Prepare()), iter(range(10))
    ahead.take(first, 2)
    ahead.read(first, 2)
    assert ahead.take(iter(range(100, 110)), 2)[0] == [100, 101]


def test_one_reader_continues_across_calls_and_epochs():
    ahead, stream = ReadAhead(Prepare()), iter(range(6))
    first_epoch = ahead.take(stream, 3)[0]
    ahead.read(stream, 3)
    assert first_epoch + ahead.take(stream, 3)[0] == list(range(6))


def test_an_error_met_reading_ahead_is_raised_when_its_batch_is_due():
    ahead, iterator = ReadAhead(Prepare()), failing(3)
    assert ahead.take(iterator, 2)[0] == [0, 1]
    ahead.read(iterator, 2)  # reads batch 2, then meets the error: held, not raised
    assert ahead.take(iterator, 1)[0] == [2]
    with pytest.raises(ValueError, match="batch 3 is corrupt"):
        ahead.take(iterator, 1)


def test_an_error_in_a_call_that_reaches_it_is_raised_by_that_call():
    ahead, iterator = ReadAhead(Prepare()), failing(3)
    ahead.take(iterator, 2)
    ahead.read(iterator, 2)
    with pytest.raises(ValueError, match="batch 3 is corrupt"):
        ahead.take(iterator, 2)


def test_batches_that_fail_to_be_prepared_ahead_are_prepared_again_when_due_and_fail_there():
    failures = []

    def prepare(batches):
        if 3 in batches and not failures:
            failures.append(batches)
            raise MemoryError("no room on the device")
        return tuple(batches)

    ahead, iterator = ReadAhead(prepare), iter(range(6))
    ahead.take(iterator, 3)
    ahead.read(iterator, 3)  # fails to prepare (3, 4, 5): not raised by the call running now
    assert failures == [[3, 4, 5]]
    assert ahead.take(iterator, 3) == ([3, 4, 5], (3, 4, 5))  # prepared again when due


@pytest.mark.parametrize(("steps_per_execution", "max_steps"), [(1, 5), (2, 6), (4, 6)])
def test_a_fit_reads_no_batch_of_a_generator_that_it_does_not_train_on(tmp_path, steps_per_execution, max_steps):
    x, y = regression_data(160)
    read = []

    def data():
        for i in range(0, 160, 8):
            read.append(i // 8)
            yield x[i:i + 8], y[i:i + 8]

    trainer = kt.Trainer(default_root_dir=str(tmp_path), batch_size=8, max_steps=max_steps, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, steps_per_execution=steps_per_execution)
    trainer.fit(Regressor(), data())
    assert trainer.global_step == max_steps
    assert read == list(range(max_steps))


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_a_fit_whose_data_fails_trains_exactly_the_batches_before_the_failure(tmp_path, steps_per_execution):
    x, y = regression_data(48)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 48, 8)]

    def data():
        yield from batches[:5]
        raise ValueError("batch 5 is corrupt")

    def trainer(**kwargs):
        return kt.Trainer(default_root_dir=str(tmp_path), batch_size=8, logger=False, enable_progress_bar=False,
                          enable_checkpointing=False, steps_per_execution=steps_per_execution, **kwargs)

    failed, module = trainer(max_epochs=1), Regressor()
    with pytest.raises(ValueError, match="batch 5 is corrupt"):
        failed.fit(module, data())
    # A call that reaches the failure trains none of its batches, with or without reading ahead.
    trained = 5 - 5 % steps_per_execution
    assert failed.global_step == trained
    reference = Regressor()
    trainer(max_steps=trained).fit(reference, batches)
    for got, expected in zip(module.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
