"""The data checks: an epoch of no batches is an error naming the data size, the batch and the replicas."""

from __future__ import annotations

import pytest

from ktrainer.data.checks import check_training_steps

pytestmark = pytest.mark.both_backends


@pytest.mark.parametrize("batches", [1, 7, None])
def test_an_epoch_with_batches_or_of_unknown_length_passes(batches):
    check_training_steps(batches, None, batch_size=8, replicas=4)


def test_zero_batches_of_known_data_name_the_examples_the_batch_and_the_replicas():
    with pytest.raises(ValueError, match=r"train_data gives 0 training batches per epoch: 20 examples, global batch 32 "
                                         r"\(batch_size=8 per device x 4 replicas\). With several replicas the last "
                                         r"incomplete batch is dropped"):
        check_training_steps(0, 20, batch_size=8, replicas=4)


def test_zero_batches_from_a_dataset_say_it_was_empty_or_too_small_and_what_to_change():
    with pytest.raises(ValueError, match=r"val_data yielded no batch in an epoch: it is empty \(check filters and "
                                         r"takes; a generator is read as one stream across epochs and had ended: "
                                         r"give it batches for every epoch, or pass an object whose __iter__ starts "
                                         r"a new pass\), or holds fewer examples than one global batch 16 "
                                         r"\(batch_size=16 per device x 1 replica\)"):
        check_training_steps(0, None, batch_size=16, replicas=1, what="val_data")
