"""CSVLogger: one row per logged step, a column per metric, hyperparameters as JSON."""

from __future__ import annotations

import csv
import json

import pytest

import ktrainer as kt
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends


def test_metrics_csv_and_hparams_json(tmp_path):
    trainer = kt.Trainer(max_epochs=2, batch_size=32, log_every_n_steps=4, default_root_dir=str(tmp_path),
                         logger=kt.loggers.CSVLogger(), enable_progress_bar=False)
    trainer.fit(Classifier(lr=0.02))
    folder = tmp_path / "csv" / "version_0"
    rows = list(csv.DictReader((folder / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [4, 8, 12, 16]
    assert {"train/loss_step", "train/acc", "val/loss", "val/acc", "epoch", "lr-Adam"} <= set(rows[0])
    assert rows[0]["val/loss"] == ""  # step 4 had no validation
    assert float(rows[-1]["val/loss"]) == pytest.approx(trainer.callback_metrics["val/loss"])
    assert [r["epoch"] for r in rows] == ["0", "0", "1", "1"]
    assert json.loads((folder / "hparams.json").read_text()) == {"lr": 0.02, "n": 256}


def test_logger_without_save_dir_outside_a_trainer_says_how_to_fix():
    with pytest.raises(RuntimeError, match="has no save_dir"):
        kt.loggers.CSVLogger().log_dir  # noqa: B018


def test_a_resumed_run_keeps_the_rows_before_its_checkpoint(tmp_path):
    for max_epochs, ckpt_path in ((1, None), (2, "last")):
        trainer = kt.Trainer(max_epochs=max_epochs, batch_size=32, log_every_n_steps=4,
                             default_root_dir=str(tmp_path), logger=kt.loggers.CSVLogger(), enable_progress_bar=False)
        trainer.fit(Classifier(), ckpt_path=ckpt_path)
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [4, 8, 12, 16]
    assert [r["epoch"] for r in rows] == ["0", "0", "1", "1"]
    assert rows[1]["val/loss"] != "" and rows[3]["val/loss"] != ""
