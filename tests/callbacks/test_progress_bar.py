"""ProgressBar: plain periodic lines when the stream is not a terminal, a tqdm bar when it is; results tables."""

from __future__ import annotations

import io
import re

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.callbacks.progress_bar import epoch_steps
from ktrainer.callbacks.results_table import format_value, results_table
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends

RATES = r"[\d.]+ step/s [\d.]+ samples/s"


class Terminal(io.StringIO):
    def isatty(self):
        return True


class WithTestData(Classifier):
    """The classifier, with test data and a test step."""

    def test_step(self, batch):
        x, y = batch
        logits = self.model(x)
        self.log("test/acc", keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits)))
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def test_data(self):
        return self.x[:64], self.y[:64]


def _plain_fit(module=None, **trainer_args):
    stream = io.StringIO()
    bar = kt.callbacks.ProgressBar(stream=stream, print_every_secs=0.0)
    trainer = kt.Trainer(callbacks=[bar], logger=False, **{"max_epochs": 1, "batch_size": 64, **trainer_args})
    trainer.fit(module or Classifier())
    return trainer, stream.getvalue().splitlines()


def test_plain_lines_when_not_a_terminal():
    _, lines = _plain_fit(max_epochs=2)
    assert re.fullmatch(rf"Epoch 1/2 step 1/4 {RATES} elapsed \d\d:\d\d:\d\d eta \d\d:\d\d:\d\d loss=[\d.e-]+",
                        lines[0])
    assert lines[3].startswith("Epoch 1/2 step 4/4")
    assert re.fullmatch(rf"Epoch 1/2 step 4/4 {RATES} epoch time \d\d:\d\d:\d\d\.\d\d loss=.*", lines[4])
    assert len([line for line in lines if line.startswith("Epoch 2/2 step 4/4")]) == 2  # last batch + epoch end


def test_samples_per_second_is_steps_per_second_times_the_global_batch():
    _, lines = _plain_fit()
    for line in lines:
        steps, samples = map(float, re.search(r"([\d.]+) step/s ([\d.]+) samples/s", line).groups())
        assert abs(samples - steps * 64) <= 0.05 + 0.005 * 64  # each printed rounded


def test_accumulated_gradients_count_optimizer_steps():
    trainer, lines = _plain_fit(batch_size=32, accumulate_grad_batches=2)
    assert [line.split(" step/s")[0].rsplit(" ", 1)[0] for line in lines[:4]] == [
        "Epoch 1/1 step 0/4", "Epoch 1/1 step 1/4", "Epoch 1/1 step 1/4", "Epoch 1/1 step 2/4"]
    assert lines[-1].startswith("Epoch 1/1 step 4/4") and "epoch time" in lines[-1]
    assert not any("/8" in line for line in lines)
    assert trainer.global_step == 4


def test_a_partial_last_accumulation_is_counted_as_the_step_it_flushes():
    _, lines = _plain_fit(batch_size=32, accumulate_grad_batches=3)  # 8 batches: 3 + 3 + 2
    assert lines[-2].startswith("Epoch 1/1 step 2/3")  # after the last batch, before the flush
    assert lines[-1].startswith("Epoch 1/1 step 3/3")


def test_an_int_limit_caps_the_total():
    _, lines = _plain_fit(limit_train_batches=3)
    assert lines[-1].startswith("Epoch 1/1 step 3/3")


def test_a_resumed_epoch_starts_at_the_resumed_step(tmp_path):
    kt.Trainer(max_steps=2, batch_size=32, accumulate_grad_batches=2, seed=1, logger=False,
               enable_progress_bar=False, default_root_dir=str(tmp_path)).fit(Classifier())  # 4 of 8 batches
    stream = io.StringIO()
    bar = kt.callbacks.ProgressBar(stream=stream, print_every_secs=0.0)
    kt.Trainer(max_epochs=1, batch_size=32, accumulate_grad_batches=2, seed=1, logger=False, callbacks=[bar],
               default_root_dir=str(tmp_path)).fit(Classifier(), ckpt_path="last")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("Epoch 1/1 step 2/4") and lines[-1].startswith("Epoch 1/1 step 4/4")


def test_the_total_uses_the_data_estimate_when_the_exact_count_is_unknown():
    class Fake:
        num_training_batches = None
        estimated_training_batches = 7
        accumulate_grad_batches = 2

    assert epoch_steps(Fake()) == 4
    Fake.num_training_batches = 5  # an int limit_train_batches below the data's length
    assert epoch_steps(Fake()) == 3
    Fake.estimated_training_batches = None
    assert epoch_steps(Fake()) == 3
    Fake.num_training_batches = None
    assert epoch_steps(Fake()) is None


def test_tqdm_bar_on_a_terminal_shows_rates_loss_and_prog_bar_metrics():
    stream = Terminal()
    bar = kt.callbacks.ProgressBar(stream=stream)

    class ShowsAccuracy(Classifier):
        def validation_step(self, batch):
            loss = super().validation_step(batch)
            self.log("val/shown", loss, prog_bar=True)
            return loss

    kt.Trainer(max_epochs=1, batch_size=32, accumulate_grad_batches=2, callbacks=[bar],
               logger=False).fit(ShowsAccuracy())
    text = stream.getvalue()
    assert "Epoch 1/1" in text and "4/4" in text and "/8" not in text
    assert "step/s" in text and "samples/s" in text
    assert re.search(r"\[\d\d:\d\d<", text)  # the elapsed time
    assert "loss=" in text and "val/shown=" in text
    assert "Validate metric" not in text  # fit's own validation prints no table


def test_validate_and_test_print_a_results_table():
    stream = io.StringIO()
    module = WithTestData()
    trainer = kt.Trainer(max_epochs=1, batch_size=64, logger=False,
                         callbacks=[kt.callbacks.ProgressBar(stream=stream, print_every_secs=1e9)])
    trainer.fit(module)
    assert "metric" not in stream.getvalue()
    validated = trainer.validate(module)
    trainer.validate(module)  # the same values again: still shown
    tested = trainer.test(module)
    tables = stream.getvalue().split("Epoch 1/1 step 4/4")[-1]
    assert tables.count("Validate metric") == 2 and tables.count("Test metric") == 1
    validate_table = tables.split("Test metric")[0].rsplit("Validate metric", 1)[1]
    test_table = tables.split("Test metric")[1]
    for name, value in validated.items():
        assert re.search(rf"│ +{re.escape(name)} +│ +{re.escape(format_value(value))} +│", validate_table)
    assert re.search(r"┃ Validate metric +┃ +Value +┃", tables) and re.search(r"┃ +Test metric +┃ +Value +┃", tables)
    for name, value in tested.items():
        assert re.search(rf"│ +{re.escape(name)} +│ +{re.escape(format_value(value))} +│", test_table)
    assert "val/" not in test_table and "test/" not in validate_table


def test_results_table_is_a_sorted_box():
    table = results_table({"val/loss": 0.693147181, "val/acc": 0.5}, "Validate metric")
    assert table.splitlines() == [
        "┏━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┓",
        "┃ Validate metric ┃  Value   ┃",
        "┡━━━━━━━━━━━━━━━━━╇━━━━━━━━━━┩",
        "│     val/acc     │   0.5    │",
        "│    val/loss     │ 0.693147 │",
        "└─────────────────┴──────────┘",
    ]
    assert "| Test metric |" in results_table({"test/loss": 1.0}, "Test metric", ascii_only=True)
    assert [format_value(v) for v in (1234.5678, 1.5e-7, 3.0)] == ["1234.57", "1.5e-07", "3"]


def test_disabled_progress_bar_prints_nothing(capsys):
    trainer = kt.Trainer(max_epochs=1, batch_size=64, enable_progress_bar=False, logger=False)
    module = WithTestData()
    trainer.fit(module)
    trainer.validate(module)
    trainer.test(module)
    assert capsys.readouterr().out == ""


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y, size):
        super().__init__()
        self.x, self.y, self.size = x, y, size

    def __len__(self):
        return int(np.ceil(len(self.x) / self.size))

    def __getitem__(self, index):
        part = slice(index * self.size, (index + 1) * self.size)
        return self.x[part], self.y[part]


def total_shown(data) -> str:
    stream = io.StringIO()
    trainer = kt.Trainer(max_epochs=1, batch_size=64, logger=False, enable_checkpointing=False,
                         callbacks=[kt.callbacks.ProgressBar(stream=stream, print_every_secs=0.0)])
    trainer.fit(Classifier(), train_data=data)
    return stream.getvalue().splitlines()[-1]


def test_a_pydataset_of_known_length_gets_a_total():
    x, y = Classifier().train_data()
    assert total_shown(Batches(x, y, 16)).startswith("Epoch 1/1 step 4/4")


@pytest.mark.tensorflow_only(reason="a tf.data.Dataset needs TensorFlow, which the JAX session refuses to import")
def test_a_dataset_of_known_length_gets_a_total():
    import tensorflow as tf

    x, y = Classifier().train_data()
    assert total_shown(tf.data.Dataset.from_tensor_slices((x, y)).batch(8)).startswith("Epoch 1/1 step 4/4")
