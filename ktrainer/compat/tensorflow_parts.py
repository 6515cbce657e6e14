"""The TensorFlow facts rooms outside the TensorFlow engine need: its global random generator's state and a
zero-copy read of a bfloat16 tensor. TensorFlow is imported here only when asked, on that backend."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["global_generator_state", "set_global_generator_state", "bfloat16_view"]


def global_generator_state() -> list[int]:
    """TensorFlow's global random generator's state, as JSON values (call it on TensorFlow only)."""
    import tensorflow as tf

    return tf.random.get_global_generator().state.numpy().tolist()


def set_global_generator_state(state: list[int]) -> None:
    """Put back what `global_generator_state` returned."""
    import tensorflow as tf

    tf.random.get_global_generator().state.assign(np.array(state, dtype=np.int64))


def bfloat16_view(tensor: Any) -> np.ndarray | None:
    """A zero-copy numpy view of a bfloat16 tensor on the host (DLPack has no bfloat16: its bits are viewed);
    None for another dtype."""
    import tensorflow as tf

    if tensor.dtype != tf.bfloat16:
        return None
    return np.from_dlpack(tf.bitcast(tensor, tf.uint16)).view(ml_dtypes.bfloat16)
