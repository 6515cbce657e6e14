"""The built-in callbacks and loggers a Trainer adds: the ones the user did not give, before the user's own."""

from __future__ import annotations

import keras
import pytest

import ktrainer as kt
from ktrainer.trainer.defaults import default_callbacks, resolve_loggers

pytestmark = pytest.mark.both_backends


def kinds(callbacks) -> list[str]:
    return [type(each).__name__ for each in callbacks]


def test_every_built_in_comes_before_the_given_ones_and_the_checkpoint_last():
    mine = kt.callbacks.EarlyStopping()
    callbacks = default_callbacks([mine], progress_bar=True, has_logger=True, checkpointing=True)
    assert kinds(callbacks) == ["ProgressBar", "LearningRateMonitor", "ThroughputMonitor", "EarlyStopping",
                                "ModelCheckpoint"]
    assert callbacks[-2] is mine


def test_given_checkpoints_move_to_the_end_in_their_order_and_the_rest_keep_theirs():
    first, second = kt.callbacks.ModelCheckpoint(every_n_train_steps=5), kt.callbacks.ModelCheckpoint(
        dirpath="best", monitor="val/loss", save_top_k=1)
    stopper, monitor = kt.callbacks.EarlyStopping(), kt.callbacks.LearningRateMonitor()
    callbacks = default_callbacks([first, stopper, second, monitor], progress_bar=False, has_logger=False,
                                  checkpointing=True)
    assert callbacks == [stopper, monitor, first, second]


def test_a_given_built_in_replaces_the_default_and_nothing_is_added_when_turned_off():
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=5)
    callbacks = default_callbacks([checkpoint], progress_bar=False, has_logger=False, checkpointing=True)
    assert callbacks == [checkpoint]
    assert default_callbacks(None, progress_bar=False, has_logger=False, checkpointing=False) == []


def test_one_callback_may_be_given_without_a_list_and_anything_else_is_named():
    mine = kt.callbacks.EarlyStopping()
    assert default_callbacks(mine, progress_bar=False, has_logger=False, checkpointing=False) == [mine]
    adapted, = default_callbacks(keras.callbacks.TerminateOnNaN(), progress_bar=False, has_logger=False,
                                 checkpointing=False)
    assert isinstance(adapted, kt.callbacks.Callback)
    with pytest.raises(ValueError, match="callbacks must be a callback or a list of callbacks; got type"):
        default_callbacks(kt.callbacks.EarlyStopping, progress_bar=False, has_logger=False, checkpointing=False)


def test_keras_callbacks_are_adapted_and_anything_else_is_an_error():
    adapted, = default_callbacks([keras.callbacks.TerminateOnNaN()], progress_bar=False, has_logger=False,
                                 checkpointing=False)
    assert isinstance(adapted, kt.callbacks.Callback)
    with pytest.raises(ValueError, match="callbacks must be ktrainer or Keras callbacks.*got str"):
        default_callbacks(["early_stopping"], progress_bar=False, has_logger=False, checkpointing=False)
    with pytest.raises(ValueError, match="ModelCheckpoint but enable_checkpointing=False"):
        default_callbacks([kt.callbacks.ModelCheckpoint()], progress_bar=False, has_logger=False,
                          checkpointing=False)


def test_loggers_from_the_logger_argument():
    assert kinds(resolve_loggers(True)) == ["TensorBoardLogger"]
    assert resolve_loggers(False) == resolve_loggers(None) == []
    csv = kt.loggers.CSVLogger()
    assert resolve_loggers(csv) == [csv] and resolve_loggers([csv]) == [csv]
    with pytest.raises(ValueError, match="logger must be True, False, a ktrainer Logger or a list of them; got str"):
        resolve_loggers("tensorboard")
