"""The FitLoop: the order of hooks across executions, stopping (callback, step limit, data that ends), and the
weights a batch hook sees."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.loop.fit_loop import _batch_hooks_read_weights
from tests.helpers import Regressor, regression_data

pytestmark = pytest.mark.both_backends


class Recorder(kt.callbacks.Callback):
    """Records every training-side hook with the global step it saw."""

    def __init__(self):
        self.calls = []

    def on_train_epoch_start(self, trainer, module):
        self.calls.append(("epoch_start", trainer.global_step))

    def on_train_batch_start(self, trainer, module, batch_idx):
        self.calls.append(("batch_start", batch_idx, trainer.global_step))

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.calls.append(("batch_end", batch_idx, trainer.global_step))

    def on_validation_start(self, trainer, module):
        self.calls.append(("validation", trainer.global_step))

    def on_train_epoch_end(self, trainer, module):
        self.calls.append(("epoch_end", trainer.global_step))

    def on_train_end(self, trainer, module):
        self.calls.append(("train_end", trainer.global_step))


def test_batch_hooks_run_once_per_execution_with_the_step_already_advanced(quiet):
    recorder = Recorder()
    trainer = kt.Trainer(max_epochs=1, batch_size=16, steps_per_execution=2, callbacks=[recorder], **quiet)
    trainer.fit(Regressor(), regression_data(n=64), regression_data(n=32, seed=1))  # 4 batches
    assert recorder.calls == [
        ("epoch_start", 0),
        ("batch_start", 0, 0), ("batch_end", 1, 2),
        ("batch_start", 2, 2), ("batch_end", 3, 4),
        ("validation", 4), ("epoch_end", 4), ("train_end", 4),
    ]


def test_a_callback_that_stops_ends_the_loop_after_that_execution_and_the_epoch_is_not_done(quiet):
    class StopAtTwo(kt.callbacks.Callback):
        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            if trainer.global_step == 2:
                trainer.should_stop = True

    trainer = kt.Trainer(max_epochs=3, batch_size=16, callbacks=[StopAtTwo()], **quiet)
    history = trainer.fit(Regressor(), regression_data(n=64))
    assert (trainer.global_step, trainer.current_epoch, trainer.progress.batch_in_epoch) == (2, 0, 2)
    assert history.epoch == []  # the epoch did not end: History records none


def test_data_that_ends_early_ends_the_epoch_and_the_next_epoch_starts_it_again(quiet):
    x, y = regression_data(n=48)

    class ThreeBatches:
        def __iter__(self):
            return iter([(x[i:i + 16], y[i:i + 16]) for i in range(0, 48, 16)])

    trainer = kt.Trainer(max_epochs=2, batch_size=16, steps_per_execution=2, **quiet)
    history = trainer.fit(Regressor(), ThreeBatches())
    assert (trainer.global_step, trainer.current_epoch) == (6, 2)
    assert history.epoch == [0, 1]


def test_a_batch_hook_reads_the_weights_of_the_step_just_taken(quiet):
    seen = []

    class ReadsWeights(kt.callbacks.Callback):
        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            seen.append(keras.ops.convert_to_numpy(module.model.weights[0]).copy())

    data = regression_data(n=64)
    trainer = kt.Trainer(max_epochs=1, batch_size=16, callbacks=[ReadsWeights()], seed=0, **quiet)
    trainer.fit(Regressor(), data, shuffle=False)
    for steps in (1, 3):
        module = Regressor()
        kt.Trainer(max_steps=steps, batch_size=16, seed=0, **quiet).fit(module, data, shuffle=False)
        np.testing.assert_allclose(seen[steps - 1], keras.ops.convert_to_numpy(module.model.weights[0]), atol=1e-6)


def test_only_callbacks_with_batch_hooks_outside_ktrainer_ask_for_the_weights():
    class EpochOnly(kt.callbacks.Callback):
        def on_train_epoch_end(self, trainer, module):
            pass

    class BatchEnd(kt.callbacks.Callback):
        def on_train_batch_end(self, trainer, module, metrics, batch_idx):
            pass

    builtins = [kt.callbacks.ProgressBar(), kt.callbacks.ModelCheckpoint(), kt.callbacks.ThroughputMonitor()]
    assert not _batch_hooks_read_weights(builtins + [EpochOnly()])
    assert _batch_hooks_read_weights(builtins + [BatchEnd()])
    assert _batch_hooks_read_weights([kt.callbacks.KerasCallback(keras.callbacks.Callback())])
