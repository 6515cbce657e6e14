"""`ktrainer fit TARGET [--config run.yaml] [--module.* ...] [--trainer.* ...] [--ckpt-path last]`."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ktrainer.trainer import Trainer

__all__ = ["add_parser", "load_module_class", "run_fit", "run_validate", "run_test", "run_stage", "print_summary"]

DESCRIPTION = ("Train the Module TARGET (FILE.py:ClassName or package.module:ClassName). Its constructor's "
               "arguments are --module.NAME flags, the Trainer's are --trainer.NAME (also --max-epochs style); "
               "both can come from a YAML file (--config run.yaml; --print-config writes the full one). "
               "Resume with --ckpt-path last, best or a checkpoint URI.")


log = logging.getLogger("ktrainer")

DESCRIPTIONS = {
    "fit": DESCRIPTION,
    "validate": "Validate the Module TARGET and print the results; --ckpt-path last|best|URI validates a "
                "checkpoint's weights. Arguments as for `ktrainer fit`.",
    "test": "Test the Module TARGET and print the results; --ckpt-path last|best|URI tests a checkpoint's "
            "weights. Arguments as for `ktrainer fit`.",
}


def load_module_class(target: str) -> type:
    """Import `path/to/file.py:ClassName` (or `package.module:ClassName`) and return the class.

    The current directory is importable, as it is for `python -m`: `pkg.mod:Class` finds ./pkg/mod.py.

    Raises:
        ValueError: For a target without ":ClassName", a missing file, or a missing class.
    """
    location, sep, class_name = target.rpartition(":")
    if not sep or not location or not class_name:
        raise ValueError(f"Expected FILE.py:ClassName or package.module:ClassName, got {target!r}.")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise ValueError(f"No such file: {location}.")
        folder = str(path.resolve().parent)  # its sibling files import, as under `python path/file.py`
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"_ktrainer_target_{path.stem}"  # a file named keras.py or yaml.py must not replace those
        spec = importlib.util.spec_from_file_location(name, path)
        python_module = importlib.util.module_from_spec(spec)
        sys.modules[name] = python_module
        spec.loader.exec_module(python_module)
    else:
        try:
            python_module = importlib.import_module(location)
        except ModuleNotFoundError as error:
            raise ValueError(f"Cannot import {location!r} ({error}); run from the directory that holds it, or "
                             "give a file path, e.g. path/to/file.py:ClassName.") from error
    if not hasattr(python_module, class_name):
        raise ValueError(f"{location} defines no {class_name!r}.")
    return getattr(python_module, class_name)


def add_parser(commands: Any) -> None:
    """Register `fit`, `validate` and `test` (their arguments are parsed by `run_stage`, from the signatures)."""
    commands.add_parser("fit", help="train a Module from a Python file", description=DESCRIPTION, add_help=False)
    commands.add_parser("validate", help="validate a Module (or a checkpoint of it) and print the results",
                        description=DESCRIPTIONS["validate"], add_help=False)
    commands.add_parser("test", help="test a Module (or a checkpoint of it) and print the results",
                        description=DESCRIPTIONS["test"], add_help=False)


def run_fit(argv: Sequence[str]) -> int:
    """`ktrainer fit`: parse the command line (and config files), build the Module and the Trainer, fit."""
    return run_stage("fit", argv)


def run_validate(argv: Sequence[str]) -> int:
    """`ktrainer validate`: validate a Module (a checkpoint's weights with --ckpt-path) and print the results."""
    return run_stage("validate", argv)


def run_test(argv: Sequence[str]) -> int:
    """`ktrainer test`: test a Module (a checkpoint's weights with --ckpt-path) and print the results."""
    return run_stage("test", argv)


def run_stage(stage: str, argv: Sequence[str]) -> int:
    """Parse the command line (and config files), build the Module and the Trainer, run `stage` on them."""
    from ktrainer.cli.config import RunParser, load_target_from_config

    target = next(iter(argv), None)
    if target is None or target.startswith("-"):
        target = load_target_from_config(argv, _read_yaml)
        argv = [target, *argv] if target else argv
    asks_help = any(token in ("-h", "--help") for token in argv)
    if not target and not asks_help:
        raise ValueError(f"ktrainer {stage} needs the Module to {stage}: TARGET (FILE.py:ClassName or "
                         f"package.module:ClassName) right after `{stage}`, or `target:` in a --config file.")
    module_class = load_module_class(target) if target and not target.startswith("-") else None
    parser = RunParser(f"ktrainer {stage}", DESCRIPTIONS[stage], module_class=module_class)
    config = parser.parse(argv)
    if config.print_config:
        print(parser.dump(config), end="")
        return 0

    import ktrainer as kt

    module = parser.build_module(config, module_class)
    trainer = kt.Trainer(**parser.trainer_kwargs(config))
    if stage == "fit":
        trainer.fit(module, ckpt_path=config.ckpt_path)
        print_summary(trainer)
        return 0
    if config.ckpt_path is None:
        log.warning("ktrainer %s without --ckpt-path evaluates the weights %s.build() creates (untrained): pass "
                    "--ckpt-path last, best or a checkpoint URI to evaluate a trained run.", stage,
                    module_class.__name__)
    metrics = getattr(trainer, stage)(module, ckpt_path=config.ckpt_path)
    if not any(isinstance(each, kt.callbacks.ProgressBar) for each in trainer.callbacks):  # it prints the table
        from ktrainer.callbacks.results_table import results_table

        print(results_table(metrics, "Validate metric" if stage == "validate" else "Test metric"))
    return 0


def _read_yaml(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as stream:
            loaded = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"Cannot read the config file {path}: {error}") from error
    return loaded if isinstance(loaded, dict) else {}


def print_summary(trainer: Trainer) -> None:
    """Print the final epoch metrics and where the logs went."""
    print(f"Finished: epoch {trainer.current_epoch}, global step {trainer.global_step}.")
    for name, value in sorted(trainer.callback_metrics.items()):
        if not name.endswith(("_step", "_epoch")) and not name.startswith("perf/"):
            print(f"  {name} = {value:.4f}")
    for logger in trainer.loggers if trainer.is_global_zero else []:  # only the chief writes logs
        print(f"Logs ({type(logger).__name__}): {logger.log_dir}")
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.last_saved:
        print(f"Last checkpoint: {checkpoint.last_saved} (resume with --ckpt-path last, or this URI)")
