"""Host memory a background save's snapshot is copied into, kept from one save to the next.

A background save must copy every array that the next training step may overwrite in place: on JAX
on a CPU, the step donates the state's buffers, so the snapshot is a host copy of each. Copied into
fresh memory, every save pays for the operating system to map and zero that memory page by page as
it is first written, which costs more than the copy itself (about 50-190 ms for 100 MB on two cores
against 10-20 ms into memory already in use). The buffers here are reused by the next save, once the
save that used them has finished writing (a manager has at most one save in flight and waits for it
before it snapshots again); the manager gives them back when it closes, at the end of fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ktrainer.checkpoint.variables import host_view, read_value

__all__ = ["HostBuffers"]


class HostBuffers:
    """The host arrays of the last background snapshot, handed to the next one in the same order.

    A snapshot reads the state in a fixed order (`snapshot.freeze` walks it as `state_dict` builds it),
    so the i-th array copied takes the i-th buffer when its shape and dtype still match, and a new one
    otherwise. Only what must be copied goes into a buffer; what `read_value` reads without a copy (a
    TensorFlow variable, a JAX array's own copy from an accelerator) is read as it is.
    """

    def __init__(self) -> None:
        self._buffers: list[np.ndarray] = []

    def reader(self) -> Callable[[Any], np.ndarray]:
        """A `freeze` snapshot function for one save: each array it copies goes into a kept buffer.

        Call it only when no save that used the previous reader's arrays is still writing them.
        """
        buffers = self._buffers
        used = 0

        def read(variable: Any) -> np.ndarray:
            nonlocal used
            source = host_view(variable)
            if source is None:
                return read_value(variable)
            if used < len(buffers) and buffers[used].shape == source.shape and buffers[used].dtype == source.dtype:
                buffer = buffers[used]
            else:
                buffer = np.empty(source.shape, source.dtype)
                if used < len(buffers):
                    buffers[used] = buffer
                else:
                    buffers.append(buffer)
            used += 1
            np.copyto(buffer, source)
            frozen = buffer.view()
            frozen.flags.writeable = False
            return frozen

        return read
