"""BatchSource: numpy, tf.data and PyDataset become global batches, in a known order."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import ktrainer as kt
from ktrainer.backends.tensorflow.feed import epoch_dataset
from ktrainer.data.sources import BatchSource
from tests.helpers import Regressor, regression_data


def _batches(source, epoch=0, skip=0, seed=0):
    return [tf.nest.map_structure(lambda t: t.numpy(), b) for b in epoch_dataset(source, epoch, skip, seed)]


def test_numpy_is_batched_and_shuffled_per_epoch_deterministically():
    x = np.arange(10, dtype=np.float32)
    source = BatchSource((x, x * 2), 4, shuffle=True)
    assert source.num_batches == 3
    epoch0, epoch1 = _batches(source, 0, seed=3), _batches(source, 1, seed=3)
    assert [len(b[0]) for b in epoch0] == [4, 4, 2]
    seen0 = np.concatenate([b[0] for b in epoch0])
    assert sorted(seen0) == list(x)  # a permutation: every example once
    np.testing.assert_array_equal(np.concatenate([b[1] for b in epoch0]), seen0 * 2)  # pairs stay together
    assert not np.array_equal(seen0, np.concatenate([b[0] for b in epoch1]))  # a new order each epoch
    again = BatchSource((x, x * 2), 4, shuffle=True)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in _batches(again, 0, seed=3)]), seen0)
    other_seed = np.concatenate([b[0] for b in _batches(again, 0, seed=4)])
    assert not np.array_equal(other_seed, seen0)


def test_skipping_consumed_batches_continues_the_same_order():
    x = np.arange(20, dtype=np.float32)
    source = BatchSource(x, 4, shuffle=True)
    whole = np.concatenate(_batches(source, 2, seed=1))
    rest = np.concatenate(_batches(source, 2, skip=3, seed=1))
    np.testing.assert_array_equal(rest, whole[12:])


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_remainder", [True, False])
@pytest.mark.parametrize(("epoch", "skip"), [(0, 0), (2, 3)])
def test_both_engines_get_the_same_batches_of_numpy_data(shuffle, drop_remainder, epoch, skip):
    x = np.arange(46, dtype=np.float32)
    source = BatchSource((x, x * 2), 4, shuffle=shuffle, drop_remainder=drop_remainder)
    fed_to_tensorflow = _batches(source, epoch, skip, seed=7)
    fed_to_jax = list(source.numpy_batches(epoch, skip, seed=7))
    assert len(fed_to_jax) == len(fed_to_tensorflow)
    for jax_batch, tf_batch in zip(fed_to_jax, fed_to_tensorflow, strict=True):
        np.testing.assert_array_equal(jax_batch[0], tf_batch[0])
        np.testing.assert_array_equal(jax_batch[1], tf_batch[1])


def test_unshuffled_numpy_batches_are_views_and_shuffled_ones_copy_only_their_rows():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    in_order = list(BatchSource(x, 4).numpy_batches(0, skip_batches=1))
    assert len(in_order) == 4 and all(np.shares_memory(batch, x) for batch in in_order)
    np.testing.assert_array_equal(in_order[0], x[4:8])
    shuffled = list(BatchSource(x, 4, shuffle=True).numpy_batches(0))
    assert [batch.shape for batch in shuffled] == [(4, 2)] * 5 and not any(np.shares_memory(b, x) for b in shuffled)


def test_tf_data_is_rebatched_to_the_global_batch_in_order():
    dataset = tf.data.Dataset.range(10).batch(3)
    source = BatchSource(dataset, 4)
    assert [list(b) for b in _batches(source)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [list(b) for b in _batches(source, 5)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert source.num_batches is None


def test_drop_remainder():
    source = BatchSource(np.arange(10), 4, drop_remainder=True)
    assert source.num_batches == 2
    assert [len(b) for b in _batches(source)] == [4, 4]


class Squares(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.epochs_ended = 0

    def __len__(self):
        return 3

    def __getitem__(self, index):
        x = np.arange(index * 3, index * 3 + 3, dtype=np.float32)
        return x, x**2

    def on_epoch_end(self):
        self.epochs_ended += 1


def test_pydataset_is_rebatched_and_told_of_epoch_ends(quiet):
    data = Squares()
    source = BatchSource(data, 4)
    assert [list(b[0]) for b in _batches(source)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]

    class Scalar(Regressor):
        def __init__(self):
            super().__init__(features=1)

        def training_step(self, batch):
            x, y = batch
            return super().training_step((x[:, None], y))

    trainer = kt.Trainer(max_epochs=2, batch_size=4, **quiet)
    trainer.fit(Scalar(), train_data=data)
    assert trainer.global_step == 6
    assert data.epochs_ended == 2


def test_estimated_batches_for_display():
    x, y = regression_data(64)
    assert BatchSource((x, y), 24).estimated_batches == 3
    assert BatchSource((x, y), 24, drop_remainder=True).estimated_batches == 2
    sliced = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = BatchSource(sliced.batch(8), 16)  # no static batch size: its first batch is read
    assert (dataset.num_batches, dataset.estimated_batches) == (None, 4)  # num_batches, which ends epochs, stays exact
    assert len(_batches(dataset)) == 4  # reading one batch changed nothing
    assert BatchSource(sliced.batch(8, drop_remainder=True), 24).estimated_batches == 3  # static: 64 examples
    assert BatchSource(sliced.batch(8, drop_remainder=True), 24, drop_remainder=True).estimated_batches == 2
    assert BatchSource(sliced.batch(8).repeat(), 16).estimated_batches is None  # infinite
    assert BatchSource(sliced.batch(8).filter(lambda a, b: True), 16).estimated_batches is None  # unknown
    assert BatchSource(Squares(), 4).estimated_batches == 3  # 3 batches of 3
    assert BatchSource(Squares(), 4, drop_remainder=True).estimated_batches == 2


def test_dict_of_arrays():
    source = BatchSource({"a": np.zeros((5, 2)), "b": np.ones(5)}, 2)
    first = _batches(source)[0]
    assert first["a"].shape == (2, 2) and first["b"].shape == (2,)


def test_unbatched_dataset_is_an_error_with_the_fix():
    with pytest.raises(ValueError, match=r"yields unbatched elements.*Add \.batch\(batch_size\)"):
        BatchSource(tf.data.Dataset.range(5), 4)


def test_infinite_dataset_needs_an_int_limit(quiet):
    x, y = regression_data(16)
    forever = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
    with pytest.raises(ValueError, match="repeats forever.*limit_train_batches"):
        kt.Trainer(max_steps=2, **quiet).fit(Regressor(), train_data=forever)
    trainer = kt.Trainer(max_epochs=2, batch_size=4, limit_train_batches=3, **quiet)
    trainer.fit(Regressor(), train_data=forever)
    assert trainer.global_step == 6


def test_fractional_limit_needs_known_length(quiet):
    x, y = regression_data(16)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with pytest.raises(ValueError, match="fractional limit .* Use an int instead"):
        kt.Trainer(max_epochs=1, limit_train_batches=0.5, **quiet).fit(Regressor(), train_data=dataset)


def test_tf_data_epochs_of_unknown_length_end_when_the_data_ends(quiet):
    x, y = regression_data(40)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(7)
    trainer = kt.Trainer(max_epochs=3, batch_size=16, steps_per_execution=2, **quiet)
    trainer.fit(Regressor(), train_data=dataset)
    assert (trainer.global_step, trainer.current_epoch) == (9, 3)  # 40 examples: batches of 16, 16, 8
