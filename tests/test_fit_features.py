"""What model.fit users rely on: a History, shuffle=False, metric objects logged exactly and reset, values logged from
Python hooks, model.losses added (or not)."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

import ktrainer as kt
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends


def quiet_trainer(**kwargs):
    return kt.Trainer(batch_size=64, logger=False, enable_progress_bar=False, **kwargs)


class WithMetricObjects(Classifier):
    """A training AUC (running, per step too) and a validation accuracy object; a value from an epoch hook."""

    def build(self):
        self.train_accuracy = keras.metrics.SparseCategoricalAccuracy()
        self.val_accuracy = keras.metrics.SparseCategoricalAccuracy()
        return super().build()

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        self.train_accuracy.update_state(y, logits)
        self.log("train/accuracy", self.train_accuracy, on_step=True, on_epoch=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def validation_step(self, batch):
        x, y = batch
        logits = self.model(x)
        self.val_accuracy.update_state(y, logits)
        self.log("val/accuracy", self.val_accuracy)

    def on_validation_epoch_end(self):
        self.log("val/hook_value", float(self.val_accuracy.result()) + 1.0)


class StepValues(kt.callbacks.Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.values.append(metrics["train/accuracy_step"])


def test_metric_objects_log_their_result_reset_each_epoch_and_hook_values_join_the_results():
    steps = StepValues()
    module = WithMetricObjects()
    history = quiet_trainer(max_epochs=2, callbacks=[steps], enable_checkpointing=False).fit(module)
    x, y = module.train_data()
    assert history.epoch == [0, 1]
    # The epoch value is the metric's result over the whole epoch, the last step's running value.
    assert history.history["train/accuracy_epoch"][1] == pytest.approx(steps.values[-1])
    # Reset at each epoch: epoch 2's result covers only epoch 2's batches (4 batches of 64).
    reference = keras.metrics.SparseCategoricalAccuracy()
    reference.update_state(y, module.model(x))  # not the same weights per batch: only the range is comparable
    assert 0.0 <= history.history["train/accuracy_epoch"][1] <= 1.0
    val_x, val_y = module.val_data()
    exact = keras.metrics.SparseCategoricalAccuracy()
    exact.update_state(val_y, module.model(val_x))
    assert history.history["val/accuracy"][1] == pytest.approx(float(exact.result()))
    assert history.history["val/hook_value"][1] == pytest.approx(float(exact.result()) + 1.0)
    del reference


def test_a_training_metric_resumed_mid_epoch_gives_the_straight_runs_epoch_result(tmp_path):
    straight = quiet_trainer(max_epochs=1, seed=1, enable_checkpointing=False).fit(WithMetricObjects())
    quiet_trainer(max_steps=2, seed=1, default_root_dir=str(tmp_path)).fit(WithMetricObjects())  # 2 of 4 batches
    resumed = quiet_trainer(max_epochs=1, seed=1, default_root_dir=str(tmp_path)).fit(WithMetricObjects(),
                                                                                      ckpt_path="last")
    assert resumed.history["train/accuracy_epoch"] == pytest.approx(straight.history["train/accuracy_epoch"])


def test_shuffle_false_keeps_the_order_and_a_checkpoint_keeps_the_setting(tmp_path):
    order = []

    class Recorder(Classifier):
        def training_step(self, batch):
            self.log("train/first", keras.ops.cast(batch[0][0, 0], "float32"))
            return super().training_step(batch)

    class Firsts(kt.callbacks.Callback):
        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            order.append(metrics["train/first"])

    module = Recorder()
    quiet_trainer(max_epochs=2, default_root_dir=str(tmp_path), callbacks=[Firsts()]).fit(module, shuffle=False)
    x = module.train_data()[0]
    expected = [x[i * 64, 0] for i in range(4)]
    assert order == pytest.approx(expected * 2)  # both epochs in the data's own order
    order.clear()
    quiet_trainer(max_epochs=3, default_root_dir=str(tmp_path), callbacks=[Firsts()]).fit(Recorder(),
                                                                                       ckpt_path="last")
    assert order == pytest.approx(expected)  # resumed without saying shuffle: the checkpoint's setting, False


class Regularized(Classifier):
    def build(self):
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(
            16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.5)), keras.layers.Dense(3)])


def test_model_losses_are_added_unless_the_module_adds_them_itself():
    added = quiet_trainer(max_steps=1, seed=0, enable_checkpointing=False, log_every_n_steps=1)
    added.fit(Regularized())
    assert added.callback_metrics["train/reg_loss_step"] > 0

    class Itself(Regularized):
        add_model_losses = False

    alone = quiet_trainer(max_steps=1, seed=0, enable_checkpointing=False, log_every_n_steps=1)
    alone.fit(Itself())
    assert "train/reg_loss_step" not in alone.callback_metrics
    assert alone.callback_metrics["train/loss_step"] == pytest.approx(
        added.callback_metrics["train/loss_step"] - added.callback_metrics["train/reg_loss_step"], rel=1e-5)


class Penalty(keras.layers.Layer):
    """Adds a constant penalty in its compute dtype (float16 under "16-mixed"), as an activity regularizer does."""

    def call(self, x):
        self.add_loss(keras.ops.cast(40000.0, self.compute_dtype))
        return x


class Penalized(Classifier):
    def build(self):
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(16, activation="relu"), Penalty(),
                                 Penalty(), keras.layers.Dense(3, dtype="float32")])


def test_float16_penalties_are_summed_in_float32_under_16_mixed():
    module = Penalized()
    run = quiet_trainer(max_steps=2, seed=0, precision="16-mixed", enable_checkpointing=False, log_every_n_steps=1)
    run.fit(module)
    module.model(module.x[:2])  # an eager call: on JAX, a compiled step's losses stay inside the step
    assert {keras.backend.standardize_dtype(term.dtype) for term in module.model.losses} == {"float16"}
    assert run.callback_metrics["train/reg_loss_step"] == 80000.0  # float16's largest is 65504: summed in float32
    assert run.callback_metrics["train/loss_step"] > 80000.0


def test_history_holds_this_calls_epochs_with_nan_for_a_name_that_appears_later():
    from ktrainer.loop.history import History

    history = History()
    history.record(3, {"a": 1.0})
    history.record(4, {"a": 2.0, "b": 5.0})
    assert history.epoch == [3, 4]
    assert history.history["a"] == [1.0, 2.0] and math.isnan(history.history["b"][0])
    assert np.isclose(history.history["b"][1], 5.0)


class Averaged(Classifier):
    def configure_optimizers(self):
        return keras.optimizers.Adam(0.01, use_ema=True, ema_momentum=0.9)


def test_a_run_with_ema_resumed_mid_epoch_ends_with_the_straight_runs_averaged_weights(tmp_path):
    straight = Averaged()
    quiet_trainer(max_epochs=2, seed=1, enable_checkpointing=False).fit(straight)
    quiet_trainer(max_steps=3, seed=1, default_root_dir=str(tmp_path)).fit(Averaged())  # stops mid epoch 0
    resumed = Averaged()
    quiet_trainer(max_epochs=2, seed=1, default_root_dir=str(tmp_path)).fit(resumed, ckpt_path="last")
    for ours, theirs in zip(resumed.model.get_weights(), straight.model.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)


class TrainDataOnly(Classifier):
    def val_data(self):
        return None


@pytest.mark.parametrize(("fraction", "message"), [
    (0.0, "validation_split must be a float between 0 and 1"),
    (1.5, "validation_split must be a float between 0 and 1"),
    ("0.2", "validation_split must be a float between 0 and 1"),
    (0.999, "leaves 0 for training and 256 for validation"),
])
def test_a_wrong_validation_split_is_an_error_before_anything_is_written(tmp_path, fraction, message):
    run = quiet_trainer(max_steps=1, default_root_dir=str(tmp_path))
    with pytest.raises(ValueError, match=message):
        run.fit(TrainDataOnly(), validation_split=fraction)
    assert list(tmp_path.iterdir()) == []


def test_validation_split_with_other_validation_data_or_a_dataset_is_an_error(tmp_path):
    run = quiet_trainer(max_steps=1, default_root_dir=str(tmp_path))
    with pytest.raises(ValueError, match="Classifier.val_data\\(\\) both give validation data"):
        run.fit(Classifier(), validation_split=0.2)
    x, y = np.zeros((10, 20), "float32"), np.zeros(10, "int32")
    with pytest.raises(ValueError, match="validation_split=0.2 and val_data both"):
        run.fit(Classifier(), train_data=(x, y), val_data=(x, y), validation_split=0.2)
    with pytest.raises(TypeError, match="needs numpy arrays, but train_data is a"):
        run.fit(TrainDataOnly(), train_data=[(x[:5], y[:5]), (x[5:], y[5:])], validation_split=0.2)
    assert list(tmp_path.iterdir()) == []
