"""Keras examples ported to Modules train number for number as model.fit trains them (float32: 1e-5), evaluate as
model.evaluate does (1e-4, uneven last batch included), predict as model.predict does; under mixed precision as fit
under the same policy."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import ktrainer as kt
from tests.parity.harness import assert_same_epoch_losses, assert_same_weights, fit_both

RNG = np.random.default_rng(0)


@pytest.fixture
def mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")  # the Keras side's policy; the Trainer sets its own
    yield
    keras.config.set_dtype_policy("float32")


class Port(kt.Module):
    """What every port shares: the optimizer the case gives, the loss of the compiled example."""

    loss_fn: keras.losses.Loss
    metric_objects: tuple = ()

    def configure_optimizers(self):
        return self.make_optimizer()

    def training_step(self, batch):
        x, y = batch[0], batch[1]
        sample_weight = batch[2] if len(batch) > 2 else None
        return self.loss_fn(y, self.model(x, training=True), sample_weight=sample_weight)

    def validation_step(self, batch):
        x, y = batch
        prediction = self.model(x, training=False)
        for metric in self.metric_objects:
            metric.update_state(y, prediction)
            self.log(f"val/{metric.name}", metric)
        return self.loss_fn(y, prediction)


# ----- an MNIST-style convnet (keras.io "Simple MNIST convnet"), with validation and predict --------------------


def convnet():
    return keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                             keras.layers.MaxPooling2D(2), keras.layers.Flatten(), keras.layers.Dropout(0.5),
                             keras.layers.Dense(3, activation="softmax", dtype="float32")])


class ConvnetPort(Port):
    def __init__(self):
        super().__init__()
        self.loss_fn = keras.losses.CategoricalCrossentropy()

    def build(self):
        self.metric_objects = [keras.metrics.CategoricalAccuracy(name="accuracy")]
        return convnet()


def images(n):
    x = RNG.random((n, 12, 12, 1)).astype("float32")
    return x, keras.utils.to_categorical((x[:, :6].mean(axis=(1, 2, 3)) * 3).astype(int) % 3, 3)


def test_convnet_trains_validates_and_predicts_as_fit_evaluate_and_predict():
    (x, y), (xv, yv) = images(80), images(37)  # 37: an uneven last validation batch
    run = fit_both(convnet, ConvnetPort, {"optimizer": lambda: keras.optimizers.Adam(0.01),
                                          "loss": "categorical_crossentropy", "metrics": ["accuracy"]},
                   x, y, fit_args={"validation_data": (xv, yv)}, val_data=(xv, yv))
    assert_same_weights(run)
    assert_same_epoch_losses(run)
    np.testing.assert_allclose(run.history["val/loss"], run.keras_history["val_loss"], atol=1e-4)
    np.testing.assert_allclose(run.history["val/accuracy"], run.keras_history["val_accuracy"], atol=1e-4)
    theirs = run.keras_model.evaluate(xv, yv, batch_size=16, verbose=0, return_dict=True)
    ours = run.trainer.validate(run.module, data=(xv, yv))
    assert ours["val/loss"] == pytest.approx(theirs["loss"], abs=1e-4)
    assert ours["val/accuracy"] == pytest.approx(theirs["accuracy"], abs=1e-4)
    np.testing.assert_allclose(run.trainer.predict(run.module, xv), run.keras_model.predict(xv, verbose=0),
                               rtol=0, atol=1e-6)


# ----- text classification with an Embedding (sparse gradients), also under 16-mixed ----------------------------


def text_model():
    return keras.Sequential([keras.Input((10,), dtype="int32"), keras.layers.Embedding(50, 8),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1, dtype="float32")])


class TextPort(Port):
    def __init__(self):
        super().__init__()
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def build(self):
        return text_model()


def tokens(n):
    x = RNG.integers(0, 50, size=(n, 10)).astype("int32")
    return x, (x[:, 0] > 25).astype("float32")[:, None]


class DensifyingAdam(keras.optimizers.Adam):
    """Adam handed every gradient dense: the math of an Embedding's sparse gradient, and fit's oracle here.

    Keras 3's TensorFlow optimizers apply an `IndexedSlices` row by row, so with plain Adam a token met twice in a
    batch adds the squares of its two rows to the second moment instead of the square of their sum, and `fit` trains
    off the math (and off JAX). ktrainer sums duplicate rows first (docs/guide.md, "Coming from model.fit"), so it
    equals `fit` handed dense gradients, not plain `fit`.
    """

    def apply(self, grads, trainable_variables=None):
        return super().apply([tf.convert_to_tensor(g) for g in grads], trainable_variables)


def test_text_classification_with_an_embedding_trains_as_fit_on_the_math_of_its_gradient():
    x, y = tokens(64)
    run = fit_both(text_model, TextPort, {"optimizer": lambda: keras.optimizers.Adam(0.01),
                                          "loss": keras.losses.BinaryCrossentropy(from_logits=True)}, x, y,
                   fit_optimizer=lambda: DensifyingAdam(0.01))
    assert_same_weights(run)
    assert_same_epoch_losses(run)


def test_text_classification_under_16_mixed_trains_as_fit_under_mixed_float16(mixed_float16):
    x, y = tokens(64)
    run = fit_both(text_model, TextPort, {"optimizer": lambda: keras.optimizers.Adam(0.01),
                                          "loss": keras.losses.BinaryCrossentropy(from_logits=True)}, x, y,
                   trainer_args={"precision": "16-mixed"}, fit_optimizer=lambda: DensifyingAdam(0.01))
    assert isinstance(run.keras_model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert_same_weights(run)  # sparse Embedding gradients under loss scaling, on fit's densified oracle
    assert_same_epoch_losses(run)


# ----- an LSTM with BatchNormalization (moving statistics in the weights) -----------------------------------------


def rnn():
    return keras.Sequential([keras.Input((6, 4)), keras.layers.LSTM(8), keras.layers.BatchNormalization(),
                             keras.layers.Dense(3)])


class RnnPort(Port):
    def __init__(self):
        super().__init__()
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def build(self):
        return rnn()


def test_lstm_with_batch_normalization_trains_as_fit():
    x = RNG.normal(size=(48, 6, 4)).astype("float32")
    y = (x[:, :, 0].sum(axis=1) > 0).astype("int32")
    run = fit_both(rnn, RnnPort, {"optimizer": lambda: keras.optimizers.RMSprop(0.01),
                                  "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, x, y)
    assert_same_weights(run)
    assert_same_epoch_losses(run)


# ----- a regularized MLP: kernel and activity regularizers are part of the loss --------------------------------


def regularized():
    return keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-2),
                           activity_regularizer=keras.regularizers.L1(1e-3)),
        keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(1e-2))])


class RegularizedPort(Port):
    def __init__(self):
        super().__init__()
        self.loss_fn = keras.losses.MeanSquaredError()

    def build(self):
        return regularized()


def test_regularizers_are_in_the_loss_as_in_fit_and_logged_apart():
    x = RNG.normal(size=(64, 5)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    run = fit_both(regularized, RegularizedPort, {"optimizer": lambda: keras.optimizers.SGD(0.05), "loss": "mse"},
                   x, y)
    assert_same_weights(run)
    assert_same_epoch_losses(run)
    assert all(value > 0 for value in run.history["train/reg_loss_epoch"])
    xv, yv = x[:37] - 0.2, y[:37]
    evaluated = run.keras_model.evaluate(xv, yv, batch_size=16, verbose=0, return_dict=True)
    validated = run.trainer.validate(run.module, data=(xv, yv))
    assert validated["val/loss"] == pytest.approx(evaluated["loss"], abs=1e-4)  # with the penalties, as evaluate


def kernel_regularized():
    # fit cannot add a bfloat16 activity regularizer's term to a float32 loss under mixed_bfloat16: kernel terms only.
    return keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-2)),
        keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(1e-2), dtype="float32")])


class KernelRegularizedPort(RegularizedPort):
    def build(self):
        return kernel_regularized()


def test_regularizers_under_bf16_mixed_train_as_fit_under_mixed_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")  # the Keras side's policy; the Trainer sets its own
    try:
        x = RNG.normal(size=(64, 5)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        run = fit_both(kernel_regularized, KernelRegularizedPort, {"optimizer": lambda: keras.optimizers.SGD(0.05),
                                                                  "loss": "mse"}, x, y,
                       trainer_args={"precision": "bf16-mixed"})
    finally:
        keras.config.set_dtype_policy("float32")
    assert run.module.model.layers[0].compute_dtype == "bfloat16"
    assert_same_weights(run)
    assert_same_epoch_losses(run)


# ----- the functional API: two inputs, two outputs, loss_weights ----------------------------------------------------


def two_headed():
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([keras.layers.Dense(8)(a), keras.layers.Dense(8)(b)]))
    return keras.Model({"a": a, "b": b}, {"reg": keras.layers.Dense(1, name="reg")(hidden),
                                          "cls": keras.layers.Dense(3, name="cls")(hidden)})


class TwoHeadedPort(Port):
    def build(self):
        self.mse, self.ce = keras.losses.MeanSquaredError(), keras.losses.SparseCategoricalCrossentropy(
            from_logits=True)
        return two_headed()

    def training_step(self, batch):
        x, y = batch
        out = self.model(x, training=True)
        return 0.5 * self.mse(y["reg"], out["reg"]) + 2.0 * self.ce(y["cls"], out["cls"])


def test_a_two_input_two_output_model_with_loss_weights_trains_as_fit():
    x = {"a": RNG.normal(size=(48, 4)).astype("float32"), "b": RNG.normal(size=(48, 3)).astype("float32")}
    y = {"reg": x["a"].sum(axis=1, keepdims=True), "cls": (x["b"][:, 0] > 0).astype("int32")}
    run = fit_both(two_headed, TwoHeadedPort, {
        "optimizer": lambda: keras.optimizers.Adam(0.01),
        "loss": {"reg": "mse", "cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        "loss_weights": {"reg": 0.5, "cls": 2.0}}, x, y)
    assert_same_weights(run)
    assert_same_epoch_losses(run)


# ----- imbalanced classification: class weights, Precision/Recall/AUC objects -------------------------------------


def fraud_model():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="relu"),
                             keras.layers.Dense(1, activation="sigmoid")])


class FraudPort(Port):
    def __init__(self):
        super().__init__()
        self.loss_fn = keras.losses.BinaryCrossentropy()

    def build(self):
        self.metric_objects = [keras.metrics.Precision(name="precision"), keras.metrics.Recall(name="recall"),
                               keras.metrics.AUC(name="auc")]
        return fraud_model()


def test_class_weights_and_metric_objects_give_evaluates_numbers_over_an_uneven_last_batch():
    x = RNG.normal(size=(96, 6)).astype("float32")
    y = (x[:, 0] + 0.3 * x[:, 1] > 1.2).astype("float32")[:, None]  # about 15% positives
    xv = RNG.normal(size=(45, 6)).astype("float32")
    yv = (xv[:, 0] + 0.3 * xv[:, 1] > 1.2).astype("float32")[:, None]
    class_weight = {0: 0.6, 1: 3.0}
    weights = np.where(y[:, 0] > 0, class_weight[1], class_weight[0]).astype("float32")  # the recipe
    run = fit_both(fraud_model, FraudPort, {
        "optimizer": lambda: keras.optimizers.Adam(0.01), "loss": "binary_crossentropy",
        "metrics": [keras.metrics.Precision(name="precision"), keras.metrics.Recall(name="recall"),
                    keras.metrics.AUC(name="auc")]},
        x, y, fit_args={"class_weight": class_weight, "validation_data": (xv, yv)}, train_data=(x, y, weights),
        val_data=(xv, yv))
    assert_same_weights(run)
    assert_same_epoch_losses(run)
    for name in ("loss", "precision", "recall", "auc"):
        np.testing.assert_allclose(run.history[f"val/{name}"], run.keras_history[f"val_{name}"], atol=1e-4)


# ----- a learning-rate schedule with warm-up, and sample weights ---------------------------------------------------


def small_mlp():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


class ScheduledPort(Port):
    def __init__(self):
        super().__init__()
        self.loss_fn = keras.losses.MeanSquaredError()

    def build(self):
        return small_mlp()


def cosine_with_warm_up():
    return keras.optimizers.SGD(keras.optimizers.schedules.CosineDecay(
        0.01, decay_steps=6, warmup_target=0.1, warmup_steps=3))


def test_cosine_decay_with_warm_up_and_sample_weights_train_as_fit():
    x = RNG.normal(size=(64, 5)).astype("float32")
    y = x[:, :1] * 2.0
    weights = RNG.uniform(0.1, 2.0, size=64).astype("float32")
    run = fit_both(small_mlp, ScheduledPort, {"optimizer": cosine_with_warm_up, "loss": "mse"}, x, y, epochs=3,
                   fit_args={"sample_weight": weights}, train_data=(x, y, weights))
    assert_same_weights(run)
    assert_same_epoch_losses(run)


def test_validation_split_holds_out_the_same_examples_as_fit():
    x = RNG.normal(size=(70, 5)).astype("float32")
    y = x[:, :1] * 2.0
    run = fit_both(small_mlp, ScheduledPort, {"optimizer": lambda: keras.optimizers.Adam(0.01), "loss": "mse"},
                   x, y, epochs=2, fit_args={"validation_split": 0.3}, our_fit_args={"validation_split": 0.3})
    assert_same_weights(run)
    assert_same_epoch_losses(run)
    np.testing.assert_allclose(run.history["val/loss"], run.keras_history["val_loss"], rtol=0, atol=1e-5)


# ----- Adam(use_ema=True): the averaged weights at the end, as fit leaves them -------------------------------------


def averaging_adam():
    return keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9)


def test_an_optimizer_with_ema_ends_with_the_averaged_weights_as_fit_does():
    x = RNG.normal(size=(64, 5)).astype("float32")
    y = x[:, :1]
    run = fit_both(small_mlp, ScheduledPort, {"optimizer": averaging_adam, "loss": "mse"}, x, y)
    assert_same_weights(run)


def test_swap_ema_weights_validates_with_the_averages_as_fit_does():
    x = RNG.normal(size=(64, 5)).astype("float32")
    y = x[:, :1]
    val_x, val_y = x[:24] + 0.1, y[:24]
    run = fit_both(small_mlp, ScheduledPort, {"optimizer": averaging_adam, "loss": "mse"}, x, y, epochs=3,
                   fit_args={"validation_data": (val_x, val_y), "callbacks": [keras.callbacks.SwapEMAWeights()]},
                   trainer_args={"callbacks": [keras.callbacks.SwapEMAWeights()]}, val_data=(val_x, val_y))
    np.testing.assert_allclose(run.history["val/loss"], run.keras_history["val_loss"], rtol=0, atol=1e-5)
    assert_same_weights(run)
    assert_same_epoch_losses(run)


# ----- gradient accumulation: accumulate_grad_batches as Keras's gradient_accumulation_steps -----------------------


class AccumulatedPort(ScheduledPort):
    def configure_optimizers(self):
        return keras.optimizers.Adam(0.01)  # the Trainer accumulates


def test_gradient_accumulation_trains_as_keras_gradient_accumulation_steps():
    x = RNG.normal(size=(96, 5)).astype("float32")
    y = x[:, :1]
    run = fit_both(small_mlp, AccumulatedPort, {"optimizer": lambda: keras.optimizers.Adam(
        0.01, gradient_accumulation_steps=2), "loss": "mse"}, x, y, trainer_args={"accumulate_grad_batches": 2})
    assert_same_weights(run)
    assert_same_epoch_losses(run)
    assert run.trainer.global_step == int(run.keras_model.optimizer.iterations.numpy()) == 6  # updates, not batches


# ----- a Normalization adapted in build(), under 16-mixed, with float32_layers -------------------------------------


def normalized(data, dtype):
    normalization = keras.layers.Normalization(dtype=dtype)
    normalization.adapt(data)
    return keras.Sequential([keras.Input((4,)), normalization, keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, dtype="float32")])


FEATURES = (RNG.normal(size=(64, 4)) * 300.0 + 2000.0).astype("float32")  # too large for float16 statistics


class NormalizedPort(ScheduledPort):
    def build(self):
        return normalized(FEATURES, None)  # float32_layers makes it float32 as it is created


def test_float32_layers_act_at_construction_like_dtype_float32_under_16_mixed(mixed_float16):
    y = ((FEATURES[:, :1] - 2000.0) / 300.0).astype("float32")
    run = fit_both(lambda: normalized(FEATURES, "float32"), NormalizedPort,
                   {"optimizer": lambda: keras.optimizers.Adam(0.01), "loss": "mse"}, FEATURES, y,
                   trainer_args={"precision": "16-mixed", "float32_layers": [keras.layers.Normalization]})
    normalization = run.module.model.layers[0]
    assert normalization.compute_dtype == "float32" and normalization.mean.dtype == "float32"
    assert run.trainer.skipped_steps == 0
    assert_same_weights(run)
    assert_same_epoch_losses(run)
