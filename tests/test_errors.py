"""Bad input gets a clear error before anything is built or written; a failing hook loses nothing."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ktrainer as kt
from tests.helpers import Classifier, Regressor, read_scalars, regression_data


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "16"}, r"precision='16' is not supported\. Use one of: '32-true', '32'"),
        ({"devices": 4}, "needs 4 logical CPU devices, but TensorFlow has already initialized its devices with 1"),
        ({"devices": 0}, "devices=0 must be >= 1"),
        ({"devices": [0, 0]}, r"devices=\[0, 0\] repeats an index"),
        ({"accelerator": "gpu"}, "accelerator='gpu', but TensorFlow sees no GPU"),
        ({"strategy": "one_device", "num_nodes": 2}, "strategy='one_device' cannot run on num_nodes=2"),
        ({"strategy": "one_device", "devices": 2}, "strategy='one_device' conflicts with devices=2"),
        ({"strategy": "parallel"}, "strategy='parallel' is not supported"),
        ({"lr_scaling": "square"}, "lr_scaling='square' is not supported. Use one of: None, 'sqrt', 'linear'"),
        ({"max_epochs": 0}, "max_epochs must be an int >= 1"),
        ({"batch_size": 0}, "batch_size must be an int >= 1"),
        ({"batch_size": 2.5}, "batch_size must be an int >= 1"),
        ({"limit_train_batches": 1.5}, r"limit_train_batches must be an int >= 1 .* or a float in \(0, 1\]"),
        ({"limit_val_batches": -1}, "limit_val_batches must be"),
        ({"val_check_interval": 0}, "val_check_interval must be"),
        ({"log_every_n_steps": 0}, "log_every_n_steps must be an int >= 1"),
        ({"gradient_clip_val": -1.0}, "gradient_clip_val must be a number > 0"),
        ({"accumulate_grad_batches": 0}, "accumulate_grad_batches must be"),
        ({"steps_per_execution": 0}, "steps_per_execution must be"),
        ({"max_in_flight": 0}, "max_in_flight must be an int >= 1"),
        ({"max_in_flight": "2"}, "max_in_flight must be an int >= 1"),
        ({"max_in_flight": True}, "max_in_flight must be an int >= 1"),
        ({"max_in_flight": 1.5}, "max_in_flight must be an int >= 1"),
        ({"seed": -3}, "seed must be an int >= 0"),
        ({"fast_dev_run": -1}, "fast_dev_run must be"),
        ({"default_root_dir": ""}, "default_root_dir must be a non-empty"),
        ({"logger": "tensorboard"}, "logger must be True, False, a ktrainer Logger"),
        ({"callbacks": [object()]}, "callbacks must be ktrainer or Keras callbacks"),
    ],
)
def test_bad_trainer_arguments_are_value_errors(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kt.Trainer(**{"default_root_dir": str(tmp_path), **kwargs})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ((np.zeros((0, 4), np.float32), np.zeros((0,), np.float32)), "empty"),
        ((np.zeros((8, 4), np.float32), np.zeros((7,), np.float32)), "different lengths"),
        (tf.data.Dataset.from_tensor_slices((np.zeros((0, 4), np.float32), np.zeros(0, np.float32))).batch(2),
         "empty tf.data.Dataset"),
        ("not data", "must be numpy arrays .an array, or a tuple/dict of arrays., a keras.utils.PyDataset"),
    ],
)
def test_bad_training_data_fails_before_any_step_or_write(tmp_path, data, match):
    trainer = kt.Trainer(max_steps=1, default_root_dir=str(tmp_path), enable_progress_bar=False)
    with pytest.raises((ValueError, TypeError), match=match):
        trainer.fit(Regressor(), train_data=data)
    assert trainer.global_step == 0
    assert list(tmp_path.iterdir()) == []


def test_no_training_data_at_all(quiet):
    with pytest.raises(ValueError, match="No train_data: pass it to the Trainer call"):
        kt.Trainer(max_steps=1, **quiet).fit(Regressor())


def test_data_exhausted_by_filter_is_reported(quiet):
    x, y = regression_data(16)
    empty = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).filter(lambda a, b: False)
    with pytest.raises(ValueError, match="yielded no batch"):
        kt.Trainer(max_steps=1, **quiet).fit(Regressor(), train_data=empty)


class Boom(RuntimeError):
    pass


class Recorder(kt.callbacks.Callback):
    def __init__(self):
        self.events = []

    def on_exception(self, trainer, module, exception):
        self.events.append(("exception", exception))

    def teardown(self, trainer, module, stage):
        self.events.append(("teardown", stage))


class FailsAtEpochEnd(Classifier):
    def on_train_epoch_end(self):
        if self.trainer.current_epoch == 1:
            raise Boom("user hook failed")


def test_error_in_a_hook_reaches_the_user_unchanged_after_cleanup(tmp_path):
    recorder = Recorder()
    trainer = kt.Trainer(max_epochs=5, batch_size=32, log_every_n_steps=1, default_root_dir=str(tmp_path),
                         callbacks=[recorder], enable_progress_bar=False)
    with pytest.raises(Boom, match="user hook failed") as caught:
        trainer.fit(FailsAtEpochEnd())
    assert recorder.events == [("exception", caught.value), ("teardown", "fit")]
    scalars = read_scalars(str(tmp_path / "tensorboard" / "version_0"))
    assert [step for step, _ in scalars["train/loss_step"]] == list(range(1, 17))
    assert trainer.loggers[0]._writer is None  # closed


def test_keras_global_policy_is_restored_after_an_error(quiet):
    import keras

    keras.config.set_dtype_policy("float32")
    with pytest.raises(Boom):
        kt.Trainer(max_epochs=3, batch_size=32, **quiet).fit(FailsAtEpochEnd())
    assert keras.config.dtype_policy().name == "float32"
