"""`ktrainer --help`: the command's entry point and its list of commands.

Nothing here imports Keras or TensorFlow: help answers at once, and a command imports what it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from ktrainer.checkpoint.io import CheckpointError
from ktrainer.cli import ckpt, compare_precision, demo, fit, launch
from ktrainer.utils.logs import configure_logging

__all__ = ["main", "build_parser"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the ktrainer package's folder

# Commands whose arguments come from signatures (jsonargparse): they take the rest of the line.
_SIGNATURE_COMMANDS = {"fit": fit.run_fit, "validate": fit.run_validate, "test": fit.run_test,
                       "demo": demo.run_demo}


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `ktrainer` command and all its sub-commands."""
    parser = argparse.ArgumentParser(prog="ktrainer", description="Train Keras 3 modules with ktrainer.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show ktrainer's debug lines (its events are shown by default)")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    demo.add_parser(commands)
    fit.add_parser(commands)
    compare_precision.add_parser(commands)
    launch.add_parser(commands)
    ckpt.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `ktrainer` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    verbose = args.verbose or any(token in ("-v", "--verbose") for token in rest)
    rest = [token for token in rest if token not in ("-v", "--verbose")]
    if args.command is None:
        parser.print_help()
        return 2
    if args.command not in _SIGNATURE_COMMANDS and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    configure_logging(verbose)
    try:
        if args.command in _SIGNATURE_COMMANDS:
            return _SIGNATURE_COMMANDS[args.command](rest)
        return args.run(args)
    except argparse.ArgumentError as error:
        print(f"ktrainer {args.command}: error: {error}\nSee: ktrainer {args.command} --help", file=sys.stderr)
        return 2
    except (ValueError, TypeError, CheckpointError) as error:
        if not _raised_by_ktrainer(error):
            raise  # the user's code (or a library under it) failed: its traceback is what helps
        print(f"ktrainer {args.command}: error: {error}", file=sys.stderr)
        return 2


def _raised_by_ktrainer(error: BaseException) -> bool:
    """True for ktrainer's own checks of what it was given (one line says it all); False for an error raised in
    the user's Module or a library it called, whose traceback the user needs."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_PACKAGE)


if __name__ == "__main__":
    sys.exit(main())
