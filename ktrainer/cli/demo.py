"""`ktrainer demo`: train the bundled classifier on generated data, in well under a minute on a CPU."""

from __future__ import annotations

import argparse
from typing import Any

from ktrainer.cli.fit import print_summary
from ktrainer.cli.trainer_flags import add_trainer_flags, trainer_kwargs

__all__ = ["add_parser", "EXPECTED_ACCURACY"]

EXPECTED_ACCURACY = 0.90


def add_parser(commands: Any) -> None:
    """Register the `demo` command."""
    parser = commands.add_parser(
        "demo", help="train the bundled demo (no download, under a minute on a CPU)",
        description=f"Train a small MLP on generated 3-class data; it reaches val/acc >= {EXPECTED_ACCURACY}.")
    add_trainer_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Train the demo and report whether it reached the stated accuracy."""
    import ktrainer as kt
    from ktrainer.demos import DemoClassifier

    defaults = {"max_epochs": 5, "batch_size": 32, "seed": 0, "default_root_dir": "runs/demo",
                "log_every_n_steps": 10}
    trainer = kt.Trainer(**trainer_kwargs(args, **defaults))
    module = DemoClassifier()
    trainer.fit(module)
    print_summary(trainer)
    accuracy = trainer.callback_metrics.get("val/acc", 0.0)
    verdict = "reached" if accuracy >= EXPECTED_ACCURACY else "did NOT reach"
    print(f"val/acc {accuracy:.3f}: {verdict} the expected {EXPECTED_ACCURACY:.2f}.")
    if trainer.loggers:
        print(f"See the curves: tensorboard --logdir {trainer.loggers[0].log_dir}")
    return 0 if accuracy >= EXPECTED_ACCURACY else 1
