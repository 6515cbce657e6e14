"""`ktrainer --help`: the command's entry point and its list of commands."""

from __future__ import annotations

import argparse
import logging
import sys

from ktrainer.checkpoint.io import CheckpointError
from ktrainer.cli import ckpt, compare_precision, demo, fit, launch

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `ktrainer` command and all its sub-commands."""
    parser = argparse.ArgumentParser(prog="ktrainer", description="Train Keras 3 modules with ktrainer.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show info-level log lines")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    demo.add_parser(commands)
    fit.add_parser(commands)
    compare_precision.add_parser(commands)
    launch.add_parser(commands)
    ckpt.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `ktrainer` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return args.run(args)
    except (ValueError, TypeError, CheckpointError) as error:
        print(f"ktrainer: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
