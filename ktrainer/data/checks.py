"""Checks of the data a run is given: errors that say what is wrong with it and how to fix it."""

from __future__ import annotations

from typing import Any

__all__ = ["check_training_steps", "check_stream_not_ended", "check_validation_stream"]


def check_stream_not_ended(source: Any, epoch: int) -> None:
    """A generator read as one stream that ends after `epoch` full epochs: an error that says how to end the run there.

    Raises:
        ValueError: When `source` is a stream and an epoch before this one trained.
    """
    if not (source.is_stream and epoch > 0):
        return
    raise ValueError(
        f"{source.what}, a generator, ran out after {epoch} epoch{'s' if epoch != 1 else ''}: it is read as one "
        f"stream across epochs, as Keras's fit reads one. Set max_epochs={epoch} (or max_steps), set "
        "limit_train_batches=N so each epoch takes N of its batches, or give it batches for every epoch. The "
        "checkpoints of the epochs it trained are kept."
    )


def check_validation_stream(source: Any, limit_val_batches: int | float | None) -> None:
    """A generator as fit's validation data needs a batch count per validation: read once, the first validation
    would read it to its end and every later one find nothing.

    Raises:
        ValueError: When `source` is a stream and `limit_val_batches` is not an int.
    """
    if source.is_stream and not isinstance(limit_val_batches, int):
        raise ValueError(
            f"{source.what} is a generator, read as one stream: the first validation would read it to its end and "
            "every later one would find nothing. Set limit_val_batches=N (batches per validation; each takes the "
            "next N), or pass validation data that can be read again (numpy arrays, a list of batches, a "
            "PyDataset, or an object whose __iter__ starts a new pass)."
        )


def check_training_steps(batches: int | None, examples: int | None, batch_size: int, replicas: int,
                         what: str = "train_data") -> None:
    """An epoch of 0 batches trains nothing: an error naming the data size, the batch size and the replicas.

    Raises:
        ValueError: When `batches` is 0.
    """
    if batches != 0:
        return
    global_batch = batch_size * replicas
    sizes = f"global batch {global_batch} (batch_size={batch_size} per device x {replicas} " \
            f"replica{'s' if replicas != 1 else ''})"
    if examples is None:  # a dataset: found out when its first epoch yielded nothing
        raise ValueError(
            f"{what} yielded no batch in an epoch: it is empty (check filters and takes; a generator is read as "
            "one stream across epochs and had ended: give it batches for every epoch, or pass an object whose "
            "__iter__ starts a new pass), or holds fewer "
            f"examples than one {sizes}, whose last incomplete batch is dropped with several replicas. Give it "
            "data, or use a smaller batch_size or fewer devices."
        )
    raise ValueError(
        f"{what} gives 0 training batches per epoch: {examples} examples, {sizes}. With several replicas the last "
        "incomplete batch is dropped, so every replica gets the same number of examples. Use a smaller "
        "batch_size, fewer devices, or more data."
    )
