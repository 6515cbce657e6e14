"""Step metrics and epoch means from the compiled steps' per-step values, Keras metric objects' results, and values
logged from Python hooks: the names each is logged under, the exact weighted means, and the errors for non-scalars."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.module import LogOptions, module_runtime
from ktrainer.progress import RunningSums
from ktrainer.step.metrics import EpochMetrics, hook_values, metric_names, metric_object_values, reset_metric_objects

pytestmark = pytest.mark.both_backends

STEP = LogOptions(on_step=True, on_epoch=False, prog_bar=False)
EPOCH = LogOptions(on_step=False, on_epoch=True, prog_bar=False)
BOTH = LogOptions(on_step=True, on_epoch=True, prog_bar=False)


def execution(sizes, **values) -> dict[str, np.ndarray]:
    """The per-step outputs of one compiled execution, with the private entries a training step adds."""
    steps = len(sizes)
    return {**{name: np.asarray(v, np.float32) for name, v in values.items()},
            "_batch_size": np.asarray(sizes, np.float32), "_applied": np.ones(steps, np.float32),
            "_skipped": np.zeros(steps, np.float32), "_stop": np.zeros(steps, np.float32)}


def test_a_value_logged_both_per_step_and_per_epoch_gets_a_suffix_for_each():
    assert metric_names("train/loss", BOTH) == ("train/loss_step", "train/loss_epoch")
    assert metric_names("train/loss", STEP) == ("train/loss", None)
    assert metric_names("val/acc", EPOCH) == (None, "val/acc")


def test_epoch_means_weigh_each_batch_by_its_examples():
    metrics = EpochMetrics({"train/loss": BOTH, "val/acc": EPOCH})
    first = execution([32, 32], **{"train/loss": [0.5, 0.25], "val/acc": [1.0, 0.5]})
    last = execution([8], **{"train/loss": [4.0], "val/acc": [0.0]})  # the epoch's short last batch
    metrics.add(first)
    metrics.add(last)
    sizes = [32, 32, 8]
    assert metrics.steps == 3
    assert metrics.epoch_metrics() == pytest.approx({
        "train/loss_epoch": np.average([0.5, 0.25, 4.0], weights=sizes),
        "val/acc": np.average([1.0, 0.5, 0.0], weights=sizes)})
    assert metrics.epoch_metrics()["train/loss_epoch"] != pytest.approx(np.mean([0.5, 0.25, 4.0]))


def test_there_are_no_epoch_means_before_the_first_step_and_none_for_step_only_values():
    metrics = EpochMetrics({"train/loss": STEP, "train/acc": BOTH})
    assert metrics.epoch_metrics() == {}
    metrics.add(execution([4], **{"train/loss": [2.0], "train/acc": [0.75]}))
    assert metrics.epoch_metrics() == {"train/acc_epoch": 0.75}


def test_the_private_step_outputs_are_neither_averaged_nor_logged():
    sums = RunningSums()
    metrics = EpochMetrics({"train/loss": BOTH}, sums)
    outputs = execution([16, 16], **{"train/loss": [1.0, 3.0]})
    metrics.add(outputs)
    assert set(sums.sums) == {"train/loss"}
    assert sums.examples == 32
    assert metrics.step_metrics(outputs, 0) == {"train/loss_step": 1.0}
    assert metrics.epoch_metrics() == {"train/loss_epoch": 2.0}


def test_step_metrics_are_the_chosen_steps_values_as_floats_under_their_step_names():
    metrics = EpochMetrics({"train/loss": BOTH, "train/lr": STEP, "train/acc": EPOCH})
    outputs = execution([4, 4, 2], **{"train/loss": [0.5, 0.25, 0.125], "train/lr": [0.1, 0.1, 0.05],
                                      "train/acc": [1.0, 0.0, 0.5]})
    step = metrics.step_metrics(outputs, 2)
    assert step == {"train/loss_step": 0.125, "train/lr": pytest.approx(0.05)}
    assert all(type(value) is float for value in step.values())


def test_a_resumed_epochs_means_include_the_steps_before_the_checkpoint():
    restored = RunningSums.from_state_dict({"sums": {"train/loss": 0.5 * 32 + 0.25 * 32}, "examples": 64,
                                            "steps": 2})
    metrics = EpochMetrics({"train/loss": EPOCH}, restored)
    metrics.add(execution([8], **{"train/loss": [4.0]}))
    assert metrics.steps == 3 and restored.steps == 3  # the sums are added to in place: a checkpoint holds them
    assert metrics.epoch_metrics() == pytest.approx({"train/loss": np.average([0.5, 0.25, 4.0],
                                                                               weights=[32, 32, 8])})


def test_the_progress_bar_shows_a_value_under_its_step_name_when_it_has_one():
    shown = LogOptions(on_step=True, on_epoch=True, prog_bar=True)
    options = {"train/loss": shown, "train/acc": LogOptions(on_step=False, on_epoch=True, prog_bar=True),
               "train/lr": LogOptions(on_step=True, on_epoch=False, prog_bar=True), "train/hidden": BOTH}
    assert EpochMetrics(options).prog_bar_names() == {"train/loss_step", "train/acc", "train/lr"}


def logged_metrics() -> tuple[kt.Module, keras.metrics.Mean, keras.metrics.Mean]:
    module = kt.Module()
    running = keras.metrics.Mean()
    module.log("train/mae", running, on_step=True, on_epoch=True)
    module_runtime(module).stage = "val"  # as the Trainer sets it around validation_step
    exact = keras.metrics.Mean()
    module.log("val/mae", exact)
    running.update_state([1.0, 2.0, 6.0])
    exact.update_state([0.5, 1.5], sample_weight=[3.0, 1.0])
    return module, running, exact


def test_metric_objects_give_their_result_under_the_step_or_the_epoch_name():
    module, _, _ = logged_metrics()
    assert metric_object_values(module, "train", epoch=False) == {"train/mae_step": 3.0}
    assert metric_object_values(module, "train", epoch=True) == {"train/mae_epoch": 3.0}
    assert metric_object_values(module, "val", epoch=True) == {"val/mae": np.average([0.5, 1.5], weights=[3, 1])}
    assert metric_object_values(module, "val", epoch=False) == {}  # logged per epoch only
    assert metric_object_values(module, "test", epoch=True) == {}  # nothing logged in that stage


def test_resetting_a_stage_resets_its_metric_objects_only():
    module, running, exact = logged_metrics()
    reset_metric_objects(module, "val")
    assert float(exact.count) == 0.0 and float(running.count) == 3.0
    exact.update_state([7.0])
    assert metric_object_values(module, "val", epoch=True) == {"val/mae": 7.0}
    reset_metric_objects(module, "test")  # a stage with no metric objects: nothing to do


def test_a_metric_object_with_a_vector_result_is_refused_with_what_to_log_instead():
    module = kt.Module()
    module_runtime(module).stage = "val"
    precision = keras.metrics.Precision(thresholds=[0.3, 0.7])
    module.log("val/precision", precision)
    precision.update_state([1.0, 0.0], [0.5, 0.9])
    with pytest.raises(ValueError, match=r"self.log\('val/precision', Precision\(...\)\): its result has shape "
                                         r"\(2,\); logged values must be scalars. Log one entry of it, or a metric"):
        metric_object_values(module, "val", epoch=True)


def test_hook_values_take_numbers_numpy_and_tensors_as_floats():
    values = hook_values({"a": 2, "b": np.float32(0.25), "c": keras.ops.convert_to_tensor(1.5),
                          "d": np.array([[4.0]])})
    assert values == {"a": 2.0, "b": 0.25, "c": 1.5, "d": 4.0}  # a one-element array is its element
    assert all(type(value) is float for value in values.values())


def test_a_hook_value_with_several_entries_is_refused_with_its_name_and_shape():
    with pytest.raises(ValueError, match=r"self.log\('val/hist', ...\) got a value of shape \(2, 3\); logged values "
                                         "must be scalars."):
        hook_values({"val/ok": 1.0, "val/hist": keras.ops.zeros((2, 3))})
