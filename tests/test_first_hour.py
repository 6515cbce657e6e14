"""What a new user meets in the first hour: silent non-training made loud, Lightning habits accepted, and the
events of a run shown (what will run at the start, why it stopped at the end)."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

import ktrainer as kt


def regression_data(n=40):
    x = np.random.default_rng(0).normal(size=(n, 3)).astype("float32")
    return x, x.sum(axis=1)


class Regression(kt.Module):
    def build(self):
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def configure_optimizers(self):
        return keras.optimizers.SGD(0.05)

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))


def quiet_trainer(**kwargs) -> kt.Trainer:
    options = {"logger": False, "enable_progress_bar": False, "enable_checkpointing": False, "batch_size": 8}
    return kt.Trainer(**{**options, **kwargs})


# ----- silent non-training, made loud ------------------------------------------------------------------


def test_val_data_without_validation_step_warns_once_and_trains(recwarn):
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(Regression(), train_data=regression_data(), val_data=regression_data(16))
    warned = [w for w in recwarn if "defines no validation_step" in str(w.message)]
    assert len(warned) == 1
    assert "Regression" in str(warned[0].message) and "validation is skipped" in str(warned[0].message)
    assert trainer.global_step == 10 and not any(name.startswith("val/") for name in trainer.callback_metrics)


def test_num_nodes_without_a_cluster_description_is_an_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError) as error:
        kt.Trainer(num_nodes=2)
    for words in ("num_nodes=2", "TF_CONFIG", "SLURM", "ktrainer launch --nodes 2", "train alone"):
        assert words in str(error.value)


class LayersInInit(Regression):
    def __init__(self):
        super().__init__()
        self.encoder = keras.layers.Dense(4)
        self.heads = [keras.layers.Dense(1)]

    def build(self):
        return keras.Sequential([keras.Input((3,)), self.encoder, self.heads[0]])


def test_a_layer_created_in_init_is_an_error_that_says_to_move_it_into_build(tmp_path):
    with pytest.raises(TypeError) as error:
        kt.Trainer(max_epochs=1, batch_size=8, enable_progress_bar=False).fit(LayersInInit(),
                                                                              train_data=regression_data())
    message = str(error.value)
    for words in ("self.encoder (Dense)", "self.heads (Dense)", "LayersInInit.build()", "precision policy",
                  "float32 under '16-mixed'", "several devices"):
        assert words in message
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "checkpoints").exists()  # nothing written


class ModelInInit(Regression):
    def __init__(self):
        super().__init__()
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def build(self):
        return self.model


def test_a_model_assigned_in_init_is_refused_too():
    with pytest.raises(TypeError, match=r"self.model \(Sequential\).*ModelInInit.build\(\) instead"):
        quiet_trainer(max_steps=1, precision="16-mixed").fit(ModelInInit(), train_data=regression_data())


def test_a_module_built_by_an_earlier_call_is_not_mistaken_for_one_built_outside_build():
    module, trainer = Regression(), quiet_trainer(max_epochs=1)
    trainer.fit(module, train_data=regression_data())
    module.head = module.model.layers[-1]  # a reference to a built layer, after build
    trainer.fit(module, train_data=regression_data())
    assert trainer.global_step == 5


# ----- Lightning habits ---------------------------------------------------------------------------------


class LightningStyle(Regression):
    def training_step(self, batch, batch_idx):
        x, y = batch
        error = self.model(x)[:, 0] - y
        self.log("train/batch_idx", keras.ops.cast(batch_idx, "float32"))
        return {"loss": keras.ops.mean(keras.ops.square(error)), "mae": keras.ops.mean(keras.ops.abs(error))}

    def validation_step(self, batch, batch_idx):
        self.log("val/batch_idx", keras.ops.cast(batch_idx, "float32"))
        x, y = batch
        return {"loss": keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))}

    def predict_step(self, batch, batch_idx):
        return keras.ops.zeros((keras.ops.shape(batch[0])[0],)) + keras.ops.cast(batch_idx, "float32")


class BatchIndices(kt.callbacks.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.seen.append((batch_idx, metrics["train/batch_idx"]))


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_batch_idx_is_the_index_within_the_epoch_and_a_dict_return_logs_its_entries(steps_per_execution):
    indices = BatchIndices()
    trainer = quiet_trainer(max_epochs=2, callbacks=[indices], steps_per_execution=steps_per_execution,
                            log_every_n_steps=1)
    module = LightningStyle()
    trainer.fit(module, train_data=regression_data(), val_data=regression_data(24))
    # The callback sees the last step of each compiled execution: its batch_idx is the one the step received.
    assert all(int(value) == batch for batch, value in indices.seen)
    assert [batch for batch, _ in indices.seen][-1] == 4 and len({b for b, _ in indices.seen}) >= 3
    assert trainer.callback_metrics["val/batch_idx"] == pytest.approx(1.0)  # mean of 0, 1, 2
    assert "train/mae" in trainer.callback_metrics and "val/loss" in trainer.callback_metrics
    predictions = trainer.predict(module, (regression_data(20)[0],))
    np.testing.assert_array_equal(predictions, np.repeat([0.0, 1.0, 2.0], [8, 8, 4]))


class NotLightning(Regression):
    def training_step(self, batch, training=True):  # a second parameter with a default is not batch_idx
        x, y = batch
        predictions = self.model(x, training=training)[:, 0]
        return {"loss": keras.ops.mean(keras.ops.square(predictions - y)), "preds": predictions}


def test_a_defaulted_second_parameter_gets_no_index_and_non_scalar_entries_are_not_logged():
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(NotLightning(), train_data=regression_data())
    assert trainer.global_step == 2 and "train/preds" not in trainer.callback_metrics


class DictWithoutLoss(Regression):
    def training_step(self, batch):
        return {"total": super().training_step(batch)}


def test_a_dict_without_loss_is_an_error_naming_its_keys():
    with pytest.raises(ValueError, match=r"training_step returned a dict with keys \['total'\], but no 'loss'"):
        quiet_trainer(max_steps=1).fit(DictWithoutLoss(), train_data=regression_data())


# ----- the events of a run ------------------------------------------------------------------------------


def fit_messages(caplog, trainer, module, **fit_kwargs) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ktrainer"):
        trainer.fit(module, train_data=regression_data(), **fit_kwargs)
    return [record.getMessage() for record in caplog.records if record.name.startswith("ktrainer")]


def test_the_start_block_and_the_stop_line_say_what_runs_and_why_it_stopped(caplog, tmp_path):
    trainer = kt.Trainer(max_epochs=2, batch_size=8, enable_progress_bar=False, default_root_dir=str(tmp_path))
    messages = fit_messages(caplog, trainer, Regression())
    (block,) = [m for m in messages if m.startswith("Fit:")]
    for words in ("4 parameters (4 trainable)", "precision='32-true' (policy float32)", "1 x cpu, strategy one_device",
                  "8 per device x 1 replica = 8 global", "40 training examples, 5 batches per epoch", "new run ",
                  "stops at       max_epochs=2", f"{tmp_path}/tensorboard/version_0", f"{tmp_path}/checkpoints"):
        assert words in block, block
    assert messages[-1].startswith("Stopped: max_epochs=2 reached, at step 10 (epoch 2) after ")
    assert f"last checkpoint {tmp_path}/checkpoints/step-00000010" in messages[-1]

    resumed = kt.Trainer(max_epochs=3, batch_size=8, enable_progress_bar=False, default_root_dir=str(tmp_path))
    messages = fit_messages(caplog, resumed, Regression(), ckpt_path="last")
    (block,) = [m for m in messages if m.startswith("Fit:")]
    assert f"resumed from {tmp_path}/checkpoints/step-00000010 at step 10 (epoch 2, batch 0)" in block

    again = kt.Trainer(max_epochs=3, batch_size=8, enable_progress_bar=False, default_root_dir=str(tmp_path))
    messages = fit_messages(caplog, again, Regression(), ckpt_path="last")
    assert "Nothing to train: the run is at step 15 (epoch 3): max_epochs=3 reached. Raise the limit to train on." \
        in messages


def test_the_stop_line_names_early_stopping_and_its_metric(caplog):
    stopper = kt.callbacks.EarlyStopping(monitor="train/loss_epoch", patience=1, min_delta=1e6)
    messages = fit_messages(caplog, quiet_trainer(max_epochs=10, callbacks=[stopper]), Regression())
    assert messages[-1].startswith("Stopped: EarlyStopping: train/loss_epoch did not improve for 1 checks (best ")
    assert "at step 10 (epoch 2)" in messages[-1]


def test_the_stop_line_names_the_best_monitored_metric_and_the_last_checkpoint(caplog, tmp_path):
    checkpoint = kt.callbacks.ModelCheckpoint(monitor="train/loss_epoch", save_top_k=1)
    trainer = kt.Trainer(max_epochs=2, batch_size=8, enable_progress_bar=False, logger=False,
                         default_root_dir=str(tmp_path), callbacks=[checkpoint])
    messages = fit_messages(caplog, trainer, Regression())
    best = trainer.checkpoint_callback.best_value
    assert f"best train/loss_epoch={best:.6g}" in messages[-1]
    assert f"last checkpoint {tmp_path}/checkpoints/step-00000010" in messages[-1]
