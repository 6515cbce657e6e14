"""`Trainer(float32_layers=...)`: layers that compute in float32 whatever the precision, from their construction.

A layer is made float32 as it is created inside `Module.build()`, exactly as if it had been
created with `dtype="float32"`: before it builds, adapts (a `Normalization` adapted in `build()`
caches its mean and variance in its own dtype) or creates any variable. Selectors are layer
classes (every instance, subclasses included) or layer names (a layer created with that
`name=`). A name Keras gives a layer itself (`dense_3`) is only known once the layer exists:
such a selector is applied to the built model instead.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import keras

from ktrainer.compat.keras_internals import flat_layers

__all__ = ["float32_at_construction", "keep_float32"]

_lock = threading.RLock()  # a build inside a build (one thread) nests; another thread waits


def _selects(selector: type | str, layer: keras.layers.Layer, name: str | None) -> bool:
    return (isinstance(selector, type) and isinstance(layer, selector)) or (isinstance(selector, str)
                                                                            and name == selector)


@contextlib.contextmanager
def float32_at_construction(selectors: Sequence[type | str]) -> Iterator[set]:
    """Within the block, layers matching `selectors` are created with `dtype="float32"`.

    Yields:
        The set of selectors that matched a layer at its construction (filled as layers are made).
    """
    matched: set = set()
    if not selectors:
        yield matched
        return
    original = keras.layers.Layer.__init__

    def init(layer: keras.layers.Layer, *args, **kwargs) -> None:
        hits = [s for s in selectors if _selects(s, layer, kwargs.get("name"))]
        if hits and not isinstance(layer, keras.layers.InputLayer):
            kwargs["dtype"] = "float32"
            matched.update(hits)
        original(layer, *args, **kwargs)

    with _lock:  # one build at a time swaps the constructor
        keras.layers.Layer.__init__ = init
        try:
            yield matched
        finally:
            keras.layers.Layer.__init__ = original


def keep_float32(model: keras.Model, selectors: Sequence[type | str]) -> list[str]:
    """Make the layers of a built model matching `selectors` compute in float32 (for selectors that matched
    nothing at construction: names Keras gave).

    Their variables keep their dtype (float32 under a mixed policy); their inputs are cast to
    float32 when they are called, and the next layer casts back to its own compute dtype.

    Returns:
        The names of the layers changed.

    Raises:
        ValueError: For a selector that matches no layer, listing the layer names and classes.
    """
    layers = [layer for layer in flat_layers(model)
              if not isinstance(layer, keras.layers.InputLayer)]
    changed = []
    for selector in selectors:
        matched = [layer for layer in layers if _selects(selector, layer, layer.name)]
        if not matched:
            names = ", ".join(f"{layer.name} ({type(layer).__name__})" for layer in layers)
            raise ValueError(f"float32_layers: {selector!r} matches no layer of the model. Its layers: {names}.")
        for layer in matched:
            layer.dtype_policy = keras.DTypePolicy("float32")
            changed.append(layer.name)
    return changed
