"""`ktrainer fit path/to/file.py:ClassName [flags]`: train a user's Module from the command line."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from ktrainer.cli.trainer_flags import add_trainer_flags, trainer_kwargs

__all__ = ["add_parser", "load_module_class"]


def load_module_class(target: str) -> type:
    """Import `path/to/file.py:ClassName` (or `package.module:ClassName`) and return the class.

    Raises:
        ValueError: For a target without ":ClassName", a missing file, or a missing class.
    """
    location, sep, class_name = target.rpartition(":")
    if not sep or not location or not class_name:
        raise ValueError(f"Expected FILE.py:ClassName or package.module:ClassName, got {target!r}.")
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise ValueError(f"No such file: {location}.")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        python_module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = python_module
        spec.loader.exec_module(python_module)
    else:
        python_module = importlib.import_module(location)
    if not hasattr(python_module, class_name):
        raise ValueError(f"{location} defines no {class_name!r}.")
    return getattr(python_module, class_name)


def add_parser(commands: Any) -> None:
    """Register the `fit` command."""
    parser = commands.add_parser("fit", help="train a Module from a Python file",
                                 description="Train FILE.py:ClassName with the given Trainer arguments.")
    parser.add_argument("target", help="FILE.py:ClassName or package.module:ClassName")
    parser.add_argument("--module-kwargs", default="{}", type=json.loads,
                        help='JSON object of constructor arguments, e.g. \'{"lr": 0.01}\'')
    add_trainer_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Build the module and the Trainer, fit, and print the final metrics."""
    import ktrainer as kt

    module_class = load_module_class(args.target)
    module = module_class(**args.module_kwargs)
    trainer = kt.Trainer(**trainer_kwargs(args))
    trainer.fit(module)
    print_summary(trainer)
    return 0


def print_summary(trainer: Any) -> None:
    """Print the final epoch metrics and where the logs went."""
    print(f"Finished: epoch {trainer.current_epoch}, global step {trainer.global_step}.")
    for name, value in sorted(trainer.callback_metrics.items()):
        if not name.endswith(("_step", "_epoch")) and not name.startswith("time/"):
            print(f"  {name} = {value:.4f}")
    for logger in trainer.loggers:
        print(f"Logs ({type(logger).__name__}): {logger.log_dir}")
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.last_saved:
        print(f"Last checkpoint: {checkpoint.last_saved} (resume with ckpt_path=\"last\" or this URI)")
