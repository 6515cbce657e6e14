"""User data (numpy arrays, PyDataset, iterables of batches, tf.data) -> global batches, one epoch at a time.

Backend-neutral and free of TensorFlow: `numpy_batches()` gives numpy global batches (the JAX engine
shards them over its devices); the TensorFlow engine builds its tf.data feed from a source
(backends/tensorflow/feed.py). A user's tf.data.Dataset is only called, never made, here.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np

from ktrainer.data.streams import Stream, is_one_shot

__all__ = ["BatchSource", "first_dim", "batches_per_epoch"]


class BatchSource:
    """One piece of user data, re-batched to the global batch size, epoch by epoch.

    - numpy arrays (an array, or a tuple/list/dict of arrays of equal length) are batched by
      the Trainer and, when `shuffle` is on, shuffled each epoch by a permutation drawn from
      `(seed, epoch)`: the same seed gives the same order, and a resumed epoch can skip exactly
      the batches it had consumed. The seed and the position are the caller's (the Trainer's
      `Progress`), passed to each epoch's reader: the source keeps no copy of them.
    - a `tf.data.Dataset` yields batches (as in Keras); it is re-batched to the global batch
      (`unbatch().batch(global_batch_size)`), keeping its order. It is never shuffled.
    - a `keras.utils.PyDataset` is read in index order and re-batched the same way.
    - any other iterable of batches (a list of `(x, y)` tuples, an object with `__iter__`) is read
      again each epoch and re-batched the same way.
    - a one-shot iterator (a generator object, a built-in iterator) is read as one stream: each
      epoch takes its next batches (`limit_train_batches` says how many), as Keras's `fit` reads a
      generator; looking at its first batch before training loses nothing (`ktrainer/data/streams.py`).

    Args:
        data: The user's data.
        global_batch_size: Examples per global batch (per-device batch size x replicas).
        shuffle: Shuffle numpy data each epoch.
        drop_remainder: Drop a last incomplete batch.
        what: The data's name for error messages, e.g. "train_data".

    Raises:
        TypeError: For a type that is not supported.
        ValueError: For empty data or arrays of unequal length.
    """

    def __init__(
        self,
        data: Any,
        global_batch_size: int,
        *,
        shuffle: bool = False,
        drop_remainder: bool = False,
        what: str = "data",
    ) -> None:
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.drop_remainder = drop_remainder
        self.what = what
        self._arrays = None
        self._dataset = None
        self._pydataset = None
        self._iterable = None
        self._stream_reader: Iterator[Any] | None = None
        if _is_tf_dataset(data):
            self._dataset = data
            self._check_dataset(data)
        elif isinstance(data, keras.utils.PyDataset):
            if len(data) == 0:
                raise ValueError(f"{what} is an empty PyDataset (len 0). Give it at least one batch.")
            self._pydataset = data
        elif _is_iterable_of_batches(data):
            self._iterable = Stream(data) if is_one_shot(data) else data
        else:
            self._arrays = _as_arrays(data, what)

    @property
    def num_examples(self) -> int | None:
        """Number of examples per epoch, when known without reading the data."""
        if self._arrays is not None:
            return first_dim(self._arrays)
        return None

    @property
    def num_batches(self) -> int | None:
        """Number of global batches per epoch, or None when it cannot be known in advance."""
        n = self.num_examples
        if n is None:
            return None
        full, rest = divmod(n, self.global_batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    @functools.cached_property
    def estimated_batches(self) -> int | None:
        """Global batches per epoch, best estimate for display (a progress bar's total); None when unknown.

        Exact for numpy. A PyDataset counts `len(data)` batches of the size of `data[0]`; a
        tf.data.Dataset of finite known cardinality counts that many batches of its static batch
        size, or else of the size of its first element (read once). A short last batch makes the
        estimate high (it counts that batch as full). Unlike `num_batches`, which ends epochs, it
        may be inexact.
        """
        if self._arrays is not None:
            return self.num_batches
        if self._pydataset is not None:
            return self._batches_of(len(self._pydataset) * first_dim(_tupled(self._pydataset[0])))
        if self._iterable is not None:
            length = len(self._iterable) if hasattr(self._iterable, "__len__") else None  # a Stream has none
            return None if length is None else self._batches_of(length * first_dim(self._first(self._read_batches())))
        cardinality = int(self._dataset.cardinality().numpy())
        if cardinality < 0:  # infinite or unknown: reading it would not tell
            return None
        return self._batches_of(cardinality * _batch_size_of(self._dataset))

    def _first(self, batches: Iterator[Any]) -> Any:
        try:
            return next(batches)
        except StopIteration:
            raise ValueError(f"{self.what} yielded no batch: it is empty, or a generator that has already been "
                             "read to its end. Give it data (a new generator for each call).") from None

    def _batches_of(self, examples: int) -> int:
        if self.drop_remainder:
            return examples // self.global_batch_size
        return math.ceil(examples / self.global_batch_size)

    @property
    def is_stream(self) -> bool:
        """True for a one-shot iterator: every epoch continues one stream, so its readers must be kept."""
        return isinstance(self._iterable, Stream)

    def reader(self, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """The iterator an epoch reads: a new one from `make()`; for a stream, the one made for its first epoch,
        every epoch, so what it read ahead or holds toward the next global batch is not lost (the skip
        `make` applies counts once)."""
        if not self.is_stream:
            return make()
        if self._stream_reader is None:
            self._stream_reader = make()
        return self._stream_reader

    @property
    def is_infinite(self) -> bool:
        """True for a tf.data.Dataset that repeats forever."""
        return self._dataset is not None and self._dataset.cardinality().numpy() == _INFINITE_CARDINALITY

    @property
    def arrays(self) -> Any:
        """The numpy arrays (a structure of them) this source batches, or None for other data."""
        return self._arrays

    @property
    def dataset(self) -> Any:
        """The user's tf.data.Dataset, or None for other data."""
        return self._dataset

    def first_batch(self) -> Any:
        """The first global batch, as numpy arrays (without shuffling, and without copying numpy data)."""
        if self._arrays is not None:
            return next(_slices(self._arrays, self.global_batch_size, drop_remainder=False))
        if self.is_stream:
            return self._first(_rebatch(self._read_batches(look_ahead=True), self.global_batch_size, False))
        return self._first(self.numpy_batches(0))

    def end_epoch(self) -> None:
        """Tell a PyDataset that the epoch ended (it may reshuffle itself)."""
        if self._pydataset is not None:
            self._pydataset.on_epoch_end()

    def numpy_batches(self, epoch: int = 0, skip_batches: int = 0, seed: int = 0) -> Iterator[Any]:
        """The global batches of one epoch as numpy arrays, without the first `skip_batches` (as `epoch()`)."""
        if self._arrays is not None:
            if not self.shuffle:
                return _slices(self._arrays, self.global_batch_size, self.drop_remainder,
                               skip_batches * self.global_batch_size)
            return _gathered(self._arrays, self.order(epoch, skip_batches, seed), self.global_batch_size,
                             self.drop_remainder)
        if self._dataset is not None:
            batches = self._dataset.as_numpy_iterator()
        else:
            batches = self._read_batches()
        regrouped = _rebatch(batches, self.global_batch_size, self.drop_remainder)
        return itertools.islice(regrouped, skip_batches, None)

    def order(self, epoch: int, skip_batches: int, seed: int) -> np.ndarray:
        """The indices of numpy examples in epoch `epoch`'s order (shuffled from `(seed, epoch)` when `shuffle`),
        without those of its first `skip_batches` global batches."""
        n = first_dim(self._arrays)
        order = np.random.default_rng([seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        return order[skip_batches * self.global_batch_size :]

    def peek_batch(self) -> Any:
        """The data's first batch as given (not re-batched), as numpy arrays, consuming nothing of a stream."""
        return self._first(self._read_batches(look_ahead=True))

    def read_batches(self) -> Iterator[Any]:
        """The batches of a PyDataset or an iterable as given (not re-batched), as numpy arrays."""
        return self._read_batches()

    def _read_batches(self, look_ahead: bool = False) -> Iterator[Any]:
        """The batches of a PyDataset (in index order) or an iterable, as numpy arrays; `look_ahead`: without
        consuming a stream's batches (to see their shapes)."""
        if self._pydataset is not None:
            batches = (self._pydataset[index] for index in range(len(self._pydataset)))
        elif look_ahead and self.is_stream:
            batches = self._iterable.look_ahead()
        else:
            batches = iter(self._iterable)
        for batch in batches:
            yield keras.tree.map_structure(np.asarray, _tupled(batch))

    def _check_dataset(self, dataset: Any) -> None:
        if dataset.cardinality().numpy() == 0:
            raise ValueError(f"{self.what} is an empty tf.data.Dataset. Give it at least one batch.")
        for spec in keras.tree.flatten(dataset.element_spec):
            if len(spec.shape) == 0:
                raise ValueError(
                    f"{self.what} yields unbatched elements (a scalar of spec {spec}), but a "
                    "tf.data.Dataset must yield batches, as in Keras. Add .batch(batch_size) to it; "
                    "the Trainer re-batches it to the global batch."
                )


def first_dim(structure: Any) -> int:
    """The leading dimension shared by every array in a structure."""
    return int(np.shape(keras.tree.flatten(structure)[0])[0])


_INFINITE_CARDINALITY = -1  # tf.data.INFINITE_CARDINALITY


def _is_tf_dataset(data: Any) -> bool:
    tf = sys.modules.get("tensorflow")  # a tf.data.Dataset exists only where TensorFlow was imported
    return tf is not None and isinstance(data, tf.data.Dataset)


def _is_iterable_of_batches(data: Any) -> bool:
    """An iterable whose items are batches: not an array, nor a tuple/dict/list of arrays (one dataset)."""
    if isinstance(data, np.ndarray | tuple | dict | str | bytes) or hasattr(data, "__array__"):
        return False
    if isinstance(data, list):
        return bool(data) and all(isinstance(item, tuple | dict | list) for item in data)
    return hasattr(data, "__iter__")


def _slices(arrays: Any, size: int, drop_remainder: bool, first: int = 0) -> Iterator[Any]:
    """Batches of `size` rows from row `first` on: views of the arrays, nothing copied."""
    total = first_dim(arrays)
    end = first + (total - first) // size * size if drop_remainder else total
    for start in range(first, end, size):
        yield keras.tree.map_structure(lambda a, start=start: a[start:start + size], arrays)


def _gathered(arrays: Any, order: np.ndarray, size: int, drop_remainder: bool) -> Iterator[Any]:
    """Batches of the rows `order` names, each gathered when it is read: an epoch never holds a second copy
    of the data, and the copying is spread over the epoch, where the JAX engine reads ahead of the device."""
    end = len(order) - len(order) % size if drop_remainder else len(order)
    for start in range(0, end, size):
        rows = order[start:start + size]
        yield keras.tree.map_structure(lambda a, rows=rows: a[rows], arrays)


def _rebatch(batches: Iterator[Any], size: int, drop_remainder: bool) -> Iterator[Any]:
    """Batches of any sizes -> batches of exactly `size` examples (the last one shorter unless dropped)."""
    pending: list[Any] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += first_dim(batch)
        while held >= size:
            joined = keras.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *pending)
            yield keras.tree.map_structure(lambda a: a[:size], joined)
            rest = keras.tree.map_structure(lambda a: a[size:], joined)
            held -= size
            pending = [rest] if held else []
    if held and not drop_remainder:
        yield keras.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *pending)


def _batch_size_of(dataset: Any) -> int:
    """The batch size of a batched dataset: its static batch dimension, or that of its first element."""
    static = keras.tree.flatten(dataset.element_spec)[0].shape[0]
    if static is not None:
        return int(static)
    first = keras.tree.flatten(next(iter(dataset.take(1))))[0]
    return int(first.shape[0])


def _tupled(element: Any) -> Any:
    return tuple(element) if isinstance(element, list) else element


def _as_arrays(data: Any, what: str) -> Any:
    if isinstance(data, list):
        data = tuple(data)
    leaves = keras.tree.flatten(data) if isinstance(data, tuple | dict) else [data]
    if not leaves or not all(isinstance(leaf, np.ndarray | np.generic) or hasattr(leaf, "__array__")
                             for leaf in leaves):
        raise TypeError(
            f"{what} must be numpy arrays (an array, or a tuple/dict of arrays), a keras.utils.PyDataset, an "
            f"iterable of batches, or a tf.data.Dataset; got {type(data).__name__}."
        )
    data = keras.tree.map_structure(np.asarray, data)
    lengths = {name: np.shape(leaf)[0] if np.ndim(leaf) else None
               for name, leaf in enumerate(keras.tree.flatten(data))}
    if any(n is None for n in lengths.values()):
        raise ValueError(f"{what} holds a scalar; every array needs a leading example dimension.")
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"{what} holds arrays of different lengths {sorted(set(lengths.values()))}; every array "
            "needs the same number of examples along its first dimension."
        )
    if next(iter(lengths.values())) == 0:
        raise ValueError(f"{what} is empty (0 examples). Give it at least one example.")
    return data


def check_validation_split(fraction: Any, val_data: Any) -> None:
    """Check `fit(validation_split=...)`: None, or a float strictly between 0 and 1, without `val_data`.

    Raises:
        ValueError: Saying what was wrong and what is expected.
    """
    if fraction is None:
        return
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 < fraction < 1.0:
        raise ValueError(f"validation_split must be a float between 0 and 1 (the fraction of the training data "
                         f"kept for validation, e.g. 0.2), got {fraction!r}.")
    if val_data is not None:
        raise ValueError(f"validation_split={fraction} and val_data both give validation data. Use one of them.")


def split_for_validation(data: Any, fraction: float, what: str = "train_data") -> tuple[Any, Any]:
    """Split numpy data as Keras's `validation_split` does: the last `fraction` of the examples, taken
    before any shuffling, is the validation data.

    Raises:
        TypeError: For data that is not numpy arrays (a dataset cannot be split without reading it).
        ValueError: When either part would be empty.
    """
    if _is_tf_dataset(data) or isinstance(data, keras.utils.PyDataset) or _is_iterable_of_batches(data):
        raise TypeError(f"validation_split={fraction} needs numpy arrays, but {what} is a {type(data).__name__} "
                        "(its length is not known without reading it). Pass val_data=... instead.")
    arrays = _as_arrays(data, what)
    total = first_dim(arrays)
    split_at = int(np.floor(total * (1.0 - fraction)))
    if split_at == 0 or split_at == total:
        raise ValueError(f"validation_split={fraction} of {total} examples leaves {split_at} for training and "
                         f"{total - split_at} for validation; each needs at least one. Use a fraction between "
                         f"{1 / total:.3g} and {1 - 1 / total:.3g}.")
    return (keras.tree.map_structure(lambda a: a[:split_at], arrays),
            keras.tree.map_structure(lambda a: a[split_at:], arrays))


def batches_per_epoch(source: BatchSource, limit: int | float | None) -> int | None:
    """Batches per epoch of `source` under a limit (an int count or a float fraction); None when unknown.

    Raises:
        ValueError: For a fractional limit on data of unknown length.
    """
    total = source.num_batches
    if limit is None:
        return total
    if isinstance(limit, int):
        return limit if total is None else min(limit, total)
    if total is None:
        raise ValueError(
            f"A fractional limit ({limit}) needs data of known length, but {source.what} is a "
            "tf.data.Dataset or PyDataset whose number of batches is unknown. Use an int instead."
        )
    return max(1, int(total * limit))
