"""Learning-rate scaling with the replica count: the factor for none, "sqrt" and "linear"; a float rate multiplied, a
schedule wrapped so each step's rate is multiplied, a loss-scale optimizer's inner rate scaled; and the wrapping
schedule saved and rebuilt by Keras's serialization."""

from __future__ import annotations

import json
import math

import keras
import pytest

from ktrainer.trainer.lr_scaling import ScaledSchedule, scale_learning_rate

pytestmark = pytest.mark.both_backends


def rate(optimizer) -> float:
    """The optimizer's learning rate at its current iteration."""
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def decay() -> keras.optimizers.schedules.ExponentialDecay:
    return keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)


def at(schedule, step: int) -> float:
    return float(keras.ops.convert_to_numpy(schedule(step)))


@pytest.mark.parametrize(("scaling", "replicas"), [(None, 8), ("sqrt", 1), ("linear", 1)])
def test_no_scaling_or_one_replica_leaves_the_rate_and_the_schedule_alone(scaling, replicas):
    plain = keras.optimizers.SGD(0.1)
    assert scale_learning_rate(plain, scaling, replicas) == 1.0
    assert rate(plain) == pytest.approx(0.1)
    schedule = decay()
    scheduled = keras.optimizers.SGD(schedule)
    assert scale_learning_rate(scheduled, scaling, replicas) == 1.0
    assert scheduled._learning_rate is schedule


@pytest.mark.parametrize(("scaling", "replicas", "factor"), [("sqrt", 4, 2.0), ("sqrt", 2, math.sqrt(2)),
                                                             ("linear", 3, 3.0)])
def test_a_float_rate_is_multiplied_by_the_square_root_or_the_number_of_replicas(scaling, replicas, factor):
    optimizer = keras.optimizers.Adam(0.01)
    assert scale_learning_rate(optimizer, scaling, replicas) == pytest.approx(factor)
    assert rate(optimizer) == pytest.approx(0.01 * factor)


def test_a_schedule_is_wrapped_so_that_every_steps_rate_is_multiplied():
    optimizer = keras.optimizers.SGD(decay())
    assert scale_learning_rate(optimizer, "linear", 4) == 4.0
    assert isinstance(optimizer._learning_rate, ScaledSchedule)
    assert rate(optimizer) == pytest.approx(0.4)
    optimizer.iterations.assign(10)
    assert rate(optimizer) == pytest.approx(0.2)  # one decay period later: 4 x 0.1 x 0.5
    for step in (0, 7, 25):
        assert at(optimizer._learning_rate, step) == pytest.approx(4 * at(decay(), step))


def test_a_loss_scale_optimizers_inner_rate_is_the_one_scaled():
    inner = keras.optimizers.SGD(0.1)
    wrapped = keras.optimizers.LossScaleOptimizer(inner)
    assert scale_learning_rate(wrapped, "sqrt", 9) == 3.0
    assert rate(inner) == pytest.approx(0.3) and rate(wrapped) == pytest.approx(0.3)
    scheduled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(decay()))
    scale_learning_rate(scheduled, "linear", 2)
    assert isinstance(scheduled.inner_optimizer._learning_rate, ScaledSchedule)


def test_a_scaled_schedules_config_is_json_and_rebuilds_the_same_rates():
    scaled = ScaledSchedule(decay(), 2)
    config = json.loads(json.dumps(scaled.get_config()))
    assert config["factor"] == 2.0 and type(scaled.factor) is float
    rebuilt = ScaledSchedule.from_config(config)
    assert isinstance(rebuilt.schedule, keras.optimizers.schedules.ExponentialDecay)
    assert [at(rebuilt, step) for step in (0, 10, 30)] == pytest.approx([0.2, 0.1, 0.025])


def test_an_optimizer_with_a_scaled_schedule_is_rebuilt_from_its_config_by_keras():
    optimizer = keras.optimizers.SGD(decay())
    scale_learning_rate(optimizer, "linear", 8)
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(optimizer)))
    rebuilt = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(rebuilt._learning_rate, ScaledSchedule) and rebuilt._learning_rate.factor == 8.0
    assert at(rebuilt._learning_rate, 20) == pytest.approx(8 * 0.1 * 0.25)


@pytest.mark.parametrize("make_rate", [lambda: 0.1, decay, lambda: (lambda: 0.1)],
                         ids=["float", "schedule", "function"])
def test_an_optimizer_scaled_again_by_a_second_fit_is_scaled_from_its_own_rate_not_twice(make_rate):
    optimizer = keras.optimizers.SGD(make_rate())
    scale_learning_rate(optimizer, "linear", 3)
    assert rate(optimizer) == pytest.approx(0.3)
    assert scale_learning_rate(optimizer, "linear", 3) == 3.0  # the module returned the same optimizer again
    assert rate(optimizer) == pytest.approx(0.3)
    scale_learning_rate(optimizer, "sqrt", 4)  # a second fit on 4 replicas
    assert rate(optimizer) == pytest.approx(0.2)
    scale_learning_rate(optimizer, "linear", 1)  # and one on a single replica
    assert rate(optimizer) == pytest.approx(0.1)


def test_a_rate_given_as_a_function_is_scaled_each_time_it_is_read():
    current = {"rate": 0.1}
    optimizer = keras.optimizers.SGD(lambda: current["rate"])
    assert scale_learning_rate(optimizer, "linear", 2) == 2.0
    assert rate(optimizer) == pytest.approx(0.2)
    current["rate"] = 0.05
    assert rate(optimizer) == pytest.approx(0.1)
