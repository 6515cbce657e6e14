"""ProgressBar: plain periodic lines when the stream is not a terminal, a tqdm bar when it is."""

from __future__ import annotations

import io
import re

import ktrainer as kt
from tests.helpers import Classifier


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    bar = kt.callbacks.ProgressBar(stream=stream, print_every_secs=0.0)
    trainer = kt.Trainer(max_epochs=2, batch_size=64, callbacks=[bar], logger=False)
    trainer.fit(Classifier())
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert re.fullmatch(r"Epoch 1/2 step 1/4 [\d.]+ step/s eta \d\d:\d\d:\d\d loss=[\d.e-]+", lines[0])
    assert lines[3].startswith("Epoch 1/2 step 4/4")
    assert len([line for line in lines if line.startswith("Epoch 2/2 step 4/4")]) == 2  # last batch + epoch end


def test_tqdm_bar_on_a_terminal_shows_loss_and_prog_bar_metrics():
    stream = Terminal()
    bar = kt.callbacks.ProgressBar(stream=stream)

    class ShowsAccuracy(Classifier):
        def validation_step(self, batch):
            loss = super().validation_step(batch)
            self.log("val/shown", loss, prog_bar=True)
            return loss

    kt.Trainer(max_epochs=1, batch_size=64, callbacks=[bar], logger=False).fit(ShowsAccuracy())
    text = stream.getvalue()
    assert "Epoch 1/1" in text and "4/4" in text
    assert "step/s" in text
    assert "loss=" in text and "val/shown=" in text


def test_disabled_progress_bar_prints_nothing(capsys):
    kt.Trainer(max_epochs=1, batch_size=64, enable_progress_bar=False, logger=False).fit(Classifier())
    assert capsys.readouterr().out == ""
