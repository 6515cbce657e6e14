"""Command-line and YAML configuration of a run: the Module's and the Trainer's arguments.

The flags are derived from the signatures and docstrings (jsonargparse, as LightningCLI does):
`--module.lr 0.01`, `--trainer.max_epochs 3`, `--config run.yaml`, `--print-config`. Every
Trainer argument also answers to its dashed name (`--max-epochs 3`, `--batch-size 32`), the short
form earlier versions of the command line used.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, set_parsing_settings

from ktrainer.cli.signature import UNSET, trainer_signature_stub

# An `Any`-typed Trainer argument (callbacks, logger) keeps a `class_path` spec as given; `instantiate` below
# builds it, looking short names up in ktrainer (jsonargparse's own building of such specs is deprecated).
set_parsing_settings(instantiate_subclass_spec_in_any=False)

__all__ = ["RunParser", "expand_short_flags", "instantiate", "load_target_from_config"]

# Short flags of earlier versions, and switches, as their jsonargparse form.
_RENAMED = {"--root": "--trainer.default_root_dir", "--module-kwargs": "--module"}
_SWITCHES = {"--no-progress-bar": "--trainer.enable_progress_bar=false", "--no-logger": "--trainer.logger=false",
             "--no-checkpointing": "--trainer.enable_checkpointing=false"}


def expand_short_flags(argv: Sequence[str], trainer_names: Sequence[str]) -> list[str]:
    """`--max-epochs 3` as `--trainer.max_epochs 3` (any Trainer argument, dashed), and the old switches."""
    expanded = []
    for position, token in enumerate(argv):
        flag, equals, value = token.partition("=")
        name = flag[2:].replace("-", "_")
        if token in _SWITCHES:
            expanded.append(_SWITCHES[token])
        elif flag in _RENAMED:
            expanded.append(_RENAMED[flag] + equals + value)
        elif flag == "--fast-dev-run" and not equals and (position + 1 == len(argv)
                                                           or argv[position + 1].startswith("-")):
            expanded.append("--trainer.fast_dev_run=1")  # a bare switch: one batch
        elif flag.startswith("--") and "." not in flag and name in trainer_names and name != "ckpt_path":
            expanded.append(f"--trainer.{name}{equals}{value}")
        else:
            expanded.append(token)
    return expanded


class RunParser:
    """The parser of `ktrainer fit`/`ktrainer demo`: a Module class's and the Trainer's arguments.

    Args:
        prog: The command's name, for usage lines.
        description: The command's help text.
        module_class: The Module whose constructor arguments become `--module.*`; None: no module flags.
        target: Take the positional TARGET (`FILE.py:Class`).
        defaults: Trainer defaults of this command (e.g. the demo's `max_epochs`), by argument name.
    """

    def __init__(self, prog: str, description: str, module_class: type | None = None, target: bool = True,
                 defaults: dict[str, Any] | None = None) -> None:
        self._trainer = trainer_signature_stub()
        self.parser = ArgumentParser(prog=prog, description=description, exit_on_error=False)
        if target:
            self.parser.add_argument("target", help="FILE.py:ClassName or package.module:ClassName (the Module); "
                                                    "may also come from the config file's `target`")
        self.parser.add_argument("--config", action=ActionConfigFile,
                                 help="a YAML (or JSON) file of any of these arguments; later flags override it")
        self.parser.add_argument("--print-config", action="store_true",
                                 help="print the whole resolved configuration as YAML and exit (save it and "
                                      "pass it back with --config)")
        self.parser.add_argument("--ckpt-path", "--ckpt_path", type=str | None, default=None,
                                 help='resume from "last", "best" or a checkpoint URI')
        if module_class is not None:
            self.parser.add_class_arguments(module_class, "module", fail_untyped=False,
                                            sub_configs=True)
        self.parser.add_function_arguments(self._trainer, "trainer", fail_untyped=False)
        self._defaults = {name: parameter.default for name, parameter in self.trainer_parameters.items()}
        if defaults:
            self.parser.set_defaults({f"trainer.{name}": value for name, value in defaults.items()})

    @property
    def trainer_parameters(self) -> dict[str, inspect.Parameter]:
        """The Trainer's constructor parameters, by name."""
        return dict(inspect.signature(self._trainer).parameters)

    def parse(self, argv: Sequence[str]) -> Namespace:
        """Parse a command line (short flags included)."""
        return self.parser.parse_args(expand_short_flags(argv, list(self.trainer_parameters)))

    def dump(self, config: Namespace) -> str:
        """The resolved configuration as YAML, without the command-line-only entries."""
        config = config.clone()
        for key in ("config", "print_config"):
            if key in config:
                del config[key]
        return self.parser.dump(config, skip_unset=False)

    def trainer_kwargs(self, config: Namespace) -> dict[str, Any]:
        """The Trainer arguments that differ from the Trainer's own defaults (the rest stay its defaults).

        Callbacks and loggers may be given as `{"class_path": "EarlyStopping", "init_args": {...}}` (a
        short name is looked up in ktrainer.callbacks and ktrainer.loggers), as in LightningCLI configs.
        """
        given = config.trainer.as_dict()
        return {name: instantiate(value) for name, value in given.items()
                if self._defaults.get(name, UNSET) is UNSET and value is not None
                or self._defaults.get(name, UNSET) is not UNSET and value != self._defaults[name]}

    def build_module(self, config: Namespace, module_class: type) -> Any:
        """The Module, built from its arguments; arguments given by `class_path` are built first, as
        LightningCLI does."""
        built = self.parser.instantiate(config).get("module")
        if isinstance(built, module_class):
            return built
        return module_class(**(built.as_dict() if isinstance(built, Namespace) else {}))


def load_target_from_config(argv: Sequence[str], read: Callable[[str], dict]) -> str | None:
    """The `target` a `--config` file names, for a command line that gives none."""
    target = None
    for position, token in enumerate(argv):
        path = token.partition("=")[2] if token.startswith("--config=") else (
            argv[position + 1] if token == "--config" and position + 1 < len(argv) else None)
        if path is not None:
            target = read(path).get("target", target)
    return target


def instantiate(value: Any) -> Any:
    """`{"class_path": ..., "init_args": {...}}` entries (also inside lists) as the objects they describe."""
    if isinstance(value, list):
        return [instantiate(each) for each in value]
    if not (isinstance(value, dict) and "class_path" in value):
        return value
    path = value["class_path"]
    if "." in path:
        home, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(home), name)
    else:
        homes = [importlib.import_module(home) for home in ("ktrainer.callbacks", "ktrainer.loggers")]
        cls = next((getattr(home, path) for home in homes if hasattr(home, path)), None)
        if cls is None:
            raise ValueError(f"class_path {path!r} is neither in ktrainer.callbacks nor in ktrainer.loggers; give "
                             "the full path, e.g. my_package.callbacks.MyCallback.")
    return cls(**value.get("init_args", {}))
