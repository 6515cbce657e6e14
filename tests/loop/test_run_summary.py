"""What a user sees of a fit without asking: the start block's rows (model size, precision, batch, learning rate,
data, limits, and where logs and checkpoints go only when they go somewhere) and the end line (why it stopped, how
far, how long, and the best monitored value only when it is a number)."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.loop.run_summary import stop_line, stop_reason

pytestmark = pytest.mark.both_backends


class Normalized(kt.Module):
    """18 parameters, 12 trainable: Dense(3 -> 2) 8, BatchNormalization 4 and its 4 moving statistics (not
    trainable), and a frozen float32 Dense(2 -> 1) without bias, 2."""

    def build(self):
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization(),
                                 keras.layers.Dense(1, use_bias=False, trainable=False, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.SGD(0.01)

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x, training=True)[:, 0] - y))

    def validation_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(n, 3)).astype("float32")
    return x, x.sum(axis=1)


def fit_block(caplog, trainer: kt.Trainer, **fit_kwargs) -> dict[str, str]:
    """The start block's rows, by name."""
    with caplog.at_level(logging.INFO, logger="ktrainer"):
        trainer.fit(Normalized(), **fit_kwargs)
    (block,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Fit:")]
    lines = block.splitlines()[1:]
    assert all(line[:2] == "  " and line[15:17] == "  " for line in lines), block  # one column of names
    return {line[2:15].strip(): line[17:] for line in lines}


def quiet(**kwargs) -> kt.Trainer:
    checkpointing = any(isinstance(each, kt.callbacks.ModelCheckpoint) for each in kwargs.get("callbacks", []))
    return kt.Trainer(**{"logger": False, "enable_progress_bar": False, "enable_checkpointing": checkpointing,
                         **kwargs})


def test_the_start_block_counts_every_parameter_and_says_how_batches_add_up_and_when_it_stops(caplog):
    trainer = quiet(max_steps=3, max_epochs=2, batch_size=8, accumulate_grad_batches=2)
    rows = fit_block(caplog, trainer, train_data=data(40), val_data=data(12))
    assert list(rows) == ["model", "precision", "devices", "batch", "learning rate", "data", "run", "stops at"]
    assert rows["model"].startswith("Normalized: sequential")
    assert rows["model"].endswith(", 18 parameters (12 trainable)")
    assert rows["batch"] == "8 per device x 1 replica = 8 global, x 2 accumulated per optimizer step"
    assert rows["learning rate"] == "as configured"
    assert rows["data"] == "40 training examples, 5 batches per epoch; validation: 12 examples"
    assert rows["run"].startswith("new run ") and rows["run"].endswith(trainer.run.run_id)
    assert rows["stops at"] == "max_steps=3 or max_epochs=2"


def test_data_of_unknown_length_is_said_so_and_mixed_precision_names_its_loss_scaling(caplog):
    batches = [data(8) for _ in range(3)]  # an iterable of batches: its length is found out by reading it
    rows = fit_block(caplog, quiet(max_steps=2, batch_size=8, precision="16-mixed"), train_data=batches,
                     val_data=batches[:1])
    assert rows["data"] == "training data of unknown length; validation"
    assert rows["precision"].startswith("precision='16-mixed' (policy mixed_float16)")
    assert rows["precision"].endswith(", dynamic loss scaling")
    assert rows["stops at"] == "max_steps=2"


def at(trainer: kt.Trainer, step: int, epoch: int, skipped: int = 0) -> kt.Trainer:
    trainer.progress.global_step, trainer.progress.epoch, trainer.progress.skipped_steps = step, epoch, skipped
    return trainer


def test_the_stop_reason_is_a_callbacks_then_max_steps_then_max_epochs():
    trainer = at(quiet(max_steps=10, max_epochs=3), step=10, epoch=2)
    assert stop_reason(trainer) == "max_steps=10 reached"
    assert stop_reason(at(trainer, step=9, epoch=3)) == "max_epochs=3 reached"
    trainer.should_stop = True
    assert stop_reason(trainer) == "a callback set trainer.should_stop"
    trainer.stop_reason = "EarlyStopping: val/loss did not improve for 3 checks"
    assert stop_reason(trainer) == "EarlyStopping: val/loss did not improve for 3 checks"


def test_the_stop_line_gives_the_step_the_skipped_steps_the_epoch_and_the_seconds():
    trainer = at(quiet(max_steps=12), step=12, epoch=3, skipped=2)
    assert stop_line(trainer, 61.04) == "Stopped: max_steps=12 reached, at step 12, 2 skipped (epoch 3) after 61.0 s."
    assert stop_line(at(trainer, step=12, epoch=3), 0.26) == \
        "Stopped: max_steps=12 reached, at step 12 (epoch 3) after 0.3 s."


@pytest.mark.parametrize(("best", "shown"), [(None, ""), (float("inf"), ""), (float("nan"), ""),
                                             (0.12345678, "; best val/loss=0.123457")])
def test_the_stop_line_gives_the_best_monitored_value_only_when_it_is_a_number(best, shown):
    checkpoint = kt.callbacks.ModelCheckpoint(monitor="val/loss")
    trainer = at(quiet(max_epochs=2, callbacks=[checkpoint]), step=8, epoch=2)
    checkpoint.best_value = best
    assert stop_line(trainer, 1.0) == f"Stopped: max_epochs=2 reached, at step 8 (epoch 2) after 1.0 s{shown}."
    checkpoint.last_saved = "s3://runs/checkpoints/step-00000008"
    assert stop_line(trainer, 1.0).endswith(f"{shown}; last checkpoint s3://runs/checkpoints/step-00000008.")


def test_a_checkpoint_that_monitors_nothing_gives_no_best_value():
    checkpoint = kt.callbacks.ModelCheckpoint()
    trainer = at(quiet(max_epochs=1, callbacks=[checkpoint]), step=4, epoch=1)
    checkpoint.best_value = 0.5
    assert stop_line(trainer, 2.0) == "Stopped: max_epochs=1 reached, at step 4 (epoch 1) after 2.0 s."
