"""Sharded strategies are the JAX engine's: on TensorFlow each is refused when the Trainer is made, naming
KERAS_BACKEND=jax as the way (Keras's TensorFlow backend has no layouts for its variables)."""

from __future__ import annotations

import pytest

import ktrainer as kt


@pytest.mark.parametrize("arguments", [{"strategy": "fsdp"}, {"strategy": "model_parallel"},
                                       {"strategy": "model_parallel", "mesh": {"batch": 2, "model": 4}},
                                       {"mesh": {"batch": 2}}])
def test_sharding_on_tensorflow_is_refused_naming_the_jax_backend(arguments, tmp_path):
    with pytest.raises(ValueError) as caught:
        kt.Trainer(default_root_dir=str(tmp_path), **arguments)
    message = str(caught.value)
    assert "KERAS_BACKEND=jax" in message
    assert "JAX backend only" in message
    assert "strategy='auto'/'mirrored'" in message
    assert list(tmp_path.iterdir()) == []
