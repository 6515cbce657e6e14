"""The Reporter: the chief's loggers get the metrics with the epoch; callbacks see logged and plain names; the bar
shows what was asked for."""

from __future__ import annotations

import pytest

from ktrainer.loggers import CSVLogger
from ktrainer.loop.reporting import Reporter

pytestmark = pytest.mark.both_backends


class Kept(CSVLogger):
    """A CSV logger that also keeps what it was sent, to compare with what the Reporter passed on."""

    def __init__(self):
        super().__init__()
        self.sent = []

    def log_metrics(self, metrics, step):
        self.sent.append((step, dict(metrics)))


def test_the_chief_writes_with_the_epoch_and_keeps_the_values():
    logger = Kept()
    reporter = Reporter([logger], lambda: True)
    reporter.log({"train/loss_step": 0.5}, step=7, epoch=2)
    assert logger.sent == [(7, {"train/loss_step": 0.5, "epoch": 2})]
    assert reporter.logged_metrics == reporter.callback_metrics == {"train/loss_step": 0.5}


def test_a_process_that_is_not_the_chief_writes_nothing_but_still_keeps_values_for_its_callbacks():
    logger = Kept()
    reporter = Reporter([logger], lambda: False)
    reporter.log({"val/loss": 0.25}, step=3, epoch=0)
    reporter.log_hyperparameters({"lr": 0.1})
    assert (logger.sent, reporter.writing_loggers) == ([], [])
    assert reporter.callback_metrics == {"val/loss": 0.25}


def test_remember_keeps_plain_names_for_callbacks_and_only_the_shown_names_for_the_bar():
    reporter = Reporter([], lambda: True)
    reporter.remember({"train/loss_step": 0.5, "train/acc_epoch": 0.75, "val/loss": 0.3}, shown={"val/loss"})
    assert reporter.callback_metrics == {"train/loss_step": 0.5, "train/loss": 0.5, "train/acc_epoch": 0.75,
                                         "train/acc": 0.75, "val/loss": 0.3}
    assert reporter.progress_bar_metrics == {"loss": 0.5, "val/loss": 0.3}
