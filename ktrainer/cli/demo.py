"""`ktrainer demo`: train the bundled classifier on generated data, in well under a minute on a CPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ktrainer.cli.fit import print_summary

__all__ = ["add_parser", "run_demo", "EXPECTED_ACCURACY"]

EXPECTED_ACCURACY = 0.90
DESCRIPTION = (f"Train a small MLP on generated 3-class data; it reaches val/acc >= {EXPECTED_ACCURACY}. "
               "Takes the Trainer's arguments as `ktrainer fit` does (--trainer.NAME or --max-epochs style).")
DEFAULTS = {"max_epochs": 5, "batch_size": 32, "seed": 0, "default_root_dir": "runs/demo", "log_every_n_steps": 10}


def add_parser(commands: Any) -> None:
    """Register the `demo` command (its arguments are parsed by `run_demo`)."""
    commands.add_parser("demo", help="train the bundled demo (no download, under a minute on a CPU)",
                        description=DESCRIPTION, add_help=False)


def run_demo(argv: Sequence[str]) -> int:
    """Train the demo and report whether it reached the stated accuracy."""
    from ktrainer.cli.config import RunParser

    parser = RunParser("ktrainer demo", DESCRIPTION, target=False, defaults=DEFAULTS)
    config = parser.parse(argv)
    if config.print_config:
        print(parser.dump(config), end="")
        return 0

    import ktrainer as kt
    from ktrainer.demos import DemoClassifier

    trainer = kt.Trainer(**parser.trainer_kwargs(config))
    module = DemoClassifier()
    trainer.fit(module, ckpt_path=config.ckpt_path)
    print_summary(trainer)
    accuracy = trainer.callback_metrics.get("val/acc", 0.0)
    verdict = "reached" if accuracy >= EXPECTED_ACCURACY else "did NOT reach"
    print(f"val/acc {accuracy:.3f}: {verdict} the expected {EXPECTED_ACCURACY:.2f}.")
    if trainer.loggers:
        print(f"See the curves: tensorboard --logdir {trainer.loggers[0].log_dir}")
    return 0 if accuracy >= EXPECTED_ACCURACY else 1
