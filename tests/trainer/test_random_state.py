"""The process's random state for exact resume: what `capture_random_state` saves (JSON values) puts back Python's,
numpy's, Keras's and, on TensorFlow, TensorFlow's global generators, so that the same numbers are drawn again; a
state written on the other engine restores too."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from ktrainer.trainer.random_state import capture_random_state, restore_random_state

pytestmark = pytest.mark.both_backends


def draws() -> tuple:
    """A few numbers from each global generator; gauss and normal use (and refill) their cached half-pair."""
    return (random.random(), random.gauss(0.0, 1.0), np.random.normal(size=3).tolist(), np.random.randint(100),
            keras.ops.convert_to_numpy(keras.random.uniform((3,))).tolist())


def test_a_restored_state_draws_the_same_numbers_again_after_going_through_json():
    random.gauss(0.0, 1.0), np.random.normal()  # a cached second gaussian is part of the state
    state = json.loads(json.dumps(capture_random_state()))  # as a checkpoint stores it
    first = draws()
    draws()
    restore_random_state(state)
    assert draws() == first


def test_a_captured_state_is_a_snapshot_that_later_draws_leave_alone_and_restores_any_number_of_times():
    state = capture_random_state()
    saved = json.dumps(state)
    first = draws()
    assert json.dumps(state) == saved
    restore_random_state(state)
    draws()
    restore_random_state(state)
    assert draws() == first
    assert json.dumps(state) == saved


def test_the_tensorflow_entry_is_written_on_tensorflow_only():
    assert set(capture_random_state()) == {"python", "numpy", "keras"} | (
        {"tensorflow"} if keras.config.backend() == "tensorflow" else set())


def test_a_state_written_on_tensorflow_restores_on_either_engine():
    state = capture_random_state()
    state.setdefault("tensorflow", [123, 0, 0])  # on JAX: the entry a TensorFlow run writes, ignored there
    first = draws()
    restore_random_state(state)
    assert draws() == first


@pytest.mark.tensorflow_only(reason="TensorFlow's generator, which the JAX session refuses to import")
def test_on_tensorflow_its_global_generator_draws_the_same_numbers_again():
    import tensorflow as tf

    generator = tf.random.get_global_generator()
    state = json.loads(json.dumps(capture_random_state()))
    first = generator.normal((4,)).numpy().tolist()
    generator.normal((4,))
    restore_random_state(state)
    assert generator.normal((4,)).numpy().tolist() == first


@pytest.mark.tensorflow_only(reason="TensorFlow's generator, which the JAX session refuses to import")
def test_a_state_written_on_jax_leaves_tensorflows_generator_where_it_is():
    import tensorflow as tf

    generator = tf.random.get_global_generator()
    state = capture_random_state()
    del state["tensorflow"]  # as a JAX run writes it
    first = draws()
    generator.normal((4,))
    position = generator.state.numpy().tolist()
    restore_random_state(state)
    assert draws() == first
    assert generator.state.numpy().tolist() == position


def test_a_process_whose_keras_generator_does_not_exist_yet_resumes_the_same_python_stream():
    # Keras makes its global generator on first use and seeds it from Python's `random`; a resumed process has
    # none yet when the state is restored, the run that saved it had one. Only a fresh process shows it.
    script = textwrap.dedent("""
        import random
        from ktrainer.trainer.random_state import capture_random_state, restore_random_state
        state = capture_random_state()
        after_capture = random.random()
        restore_random_state(state)
        print(random.random() == after_capture)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "True"
