"""What a compiled step returns and the checks on what a step hook gives: batch sizes, float32 scalar logs, the loss
checks and their messages, the model's own losses added as Keras adds them, and one evaluation step's outputs."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.module import LogOptions, module_runtime
from ktrainer.step.outputs import BATCH_SIZE, EvalStep, batch_size_of, check_loss, scalar_logs, with_model_losses

pytestmark = pytest.mark.both_backends


def value(tensor) -> np.ndarray:
    return keras.ops.convert_to_numpy(tensor)


def dtype(tensor) -> str:
    return keras.backend.standardize_dtype(tensor.dtype)


def test_the_batch_size_is_the_leading_dimension_of_the_first_tensor_as_float32():
    size = batch_size_of((np.zeros((5, 3), np.float32), np.zeros((5,), np.int32)))
    assert float(value(size)) == 5.0 and dtype(size) == "float32"
    assert float(value(batch_size_of({"image": np.zeros((7, 2, 2)), "label": np.zeros(7)}))) == 7.0
    assert float(value(batch_size_of(np.zeros((3, 4))))) == 3.0


def test_logged_scalars_are_cast_to_float32():
    logs = scalar_logs({"train/count": 3, "train/mean": np.float64(0.25),
                        "train/half": keras.ops.convert_to_tensor(1.5, "float16")}, "training_step")
    assert {name: dtype(tensor) for name, tensor in logs.items()} == dict.fromkeys(logs, "float32")
    assert {name: float(value(tensor)) for name, tensor in logs.items()} == {
        "train/count": 3.0, "train/mean": 0.25, "train/half": 1.5}


def test_a_logged_value_that_is_not_a_scalar_is_refused_with_its_name_shape_and_a_fix():
    with pytest.raises(ValueError, match=r"self.log\('val/acc', ...\) in validation_step got a value of shape \(1,\); "
                                         r"logged values must be scalars. Reduce it first, e.g. keras.ops.mean"):
        scalar_logs({"val/loss": 1.0, "val/acc": np.array([0.5])}, "validation_step")


def test_a_scalar_float_loss_of_any_float_dtype_is_accepted_as_a_tensor():
    assert float(value(check_loss(0.5, "training_step"))) == 0.5
    half = check_loss(keras.ops.convert_to_tensor(2.0, "float16"), "training_step")
    assert dtype(half) == "float16" and float(value(half)) == 2.0


@pytest.mark.parametrize(("loss", "message"), [
    (None, "training_step returned None; it must return the scalar float loss of the batch."),
    (np.zeros((4,), np.float32), r"training_step returned a loss of shape \(4,\); it must be a scalar. Reduce it, "
                                 r"e.g. keras.ops.mean\(per_example_loss\)."),
    (np.int32(3), "training_step returned a loss of dtype int32; it must be a float. Cast it, e.g. "
                  r"keras.ops.cast\(loss, 'float32'\)."),
    (np.bool_(True), "training_step returned a loss of dtype bool; it must be a float."),
])
def test_a_loss_that_is_missing_not_scalar_or_not_float_is_refused_with_what_was_found(loss, message):
    with pytest.raises(ValueError, match=message):
        check_loss(loss, "training_step")


class Regularized(kt.Module):
    """A Dense layer with known weights and an L2 penalty of 0.5 * sum(kernel ** 2) = 0.5 * (1 + 4) = 2.5.

    Its model is made here, not in build(): these tests call the step functions without a Trainer.
    """

    def __init__(self, penalty: float | None = 0.5):
        super().__init__()
        regularizer = keras.regularizers.L2(penalty) if penalty else None
        self.model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(
            1, kernel_initializer=keras.initializers.Constant([[1.0], [2.0]]), kernel_regularizer=regularizer)])

    def validation_step(self, batch):
        x, y = batch
        self.log("val/first", x[0, 0])
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))

    def test_step(self, batch, batch_idx):
        return {"loss": keras.ops.mean(batch[1]), "index": batch_idx, "preds": self.model(batch[0])}


def test_the_models_own_losses_are_added_and_logged_as_reg_loss():
    module = Regularized()
    loss = with_model_losses(module, keras.ops.convert_to_tensor(1.0), "train")
    assert float(value(loss)) == pytest.approx(3.5)
    assert float(value(module_runtime(module).take_logged()["train/reg_loss"])) == pytest.approx(2.5)
    assert module_runtime(module).log_options["train/reg_loss"] == LogOptions(on_step=True, on_epoch=True,
                                                                               prog_bar=False)


def test_in_evaluation_the_reg_loss_is_logged_per_epoch_and_the_loss_keeps_its_dtype():
    module = Regularized()
    module_runtime(module).stage = "val"  # as EvalStep sets it
    loss = with_model_losses(module, keras.ops.convert_to_tensor(1.0, "float16"), "val")
    assert dtype(loss) == "float16" and float(value(loss)) == pytest.approx(3.5)
    assert module_runtime(module).log_options["val/reg_loss"] == LogOptions(on_step=False, on_epoch=True,
                                                                             prog_bar=False)


@pytest.mark.parametrize("case", ["no penalty", "switched off", "no model"])
def test_nothing_is_added_or_logged_without_model_losses_or_when_switched_off(case):
    module = Regularized(penalty=None if case == "no penalty" else 0.5)
    module.add_model_losses = case != "switched off"
    if case == "no model":
        module.model = None
    loss = keras.ops.convert_to_tensor(1.0)
    assert with_model_losses(module, loss, "train") is loss
    assert module_runtime(module).take_logged() == {}


def test_an_evaluation_step_returns_its_logs_and_loss_as_float32_with_the_batch_size():
    module = Regularized()
    module_runtime(module).log_buffer["train/stale"] = 9.0  # left by an earlier hook: not this step's
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    y = np.array([0.0, 0.0, 0.0], np.float32)
    outputs = EvalStep(module, "validation_step", "val")((x, y))
    assert module_runtime(module).stage == "val"
    assert set(outputs) == {"val/first", "val/reg_loss", "val/loss", BATCH_SIZE}
    assert {dtype(tensor) for tensor in outputs.values()} == {"float32"}
    squared_error = np.mean((x @ np.array([1.0, 2.0]) - y) ** 2)  # (1 + 4 + 9) / 3
    assert float(value(outputs["val/loss"])) == pytest.approx(squared_error + 2.5)
    assert float(value(outputs["val/reg_loss"])) == pytest.approx(2.5)
    assert float(value(outputs["val/first"])) == 1.0 and float(value(outputs[BATCH_SIZE])) == 3.0
    assert module_runtime(module).take_logged() == {}


def test_an_evaluation_step_that_returns_nothing_logs_no_loss():
    module = kt.Module()
    outputs = EvalStep(module, "test_step", "test")((np.zeros((4, 2), np.float32),))
    assert set(outputs) == {BATCH_SIZE} and float(value(outputs[BATCH_SIZE])) == 4.0


def test_an_evaluation_step_takes_a_returned_dicts_loss_and_scalars_and_gives_the_hook_its_batch_idx():
    module = Regularized(penalty=None)
    x, y = np.ones((2, 2), np.float32), np.array([0.5, 1.5], np.float32)
    outputs = EvalStep(module, "test_step", "test")((x, y))
    assert set(outputs) == {"test/loss", "test/index", BATCH_SIZE}  # the predictions are not logged
    assert float(value(outputs["test/loss"])) == 1.0 and float(value(outputs["test/index"])) == 0.0
