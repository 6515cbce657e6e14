"""`ktrainer compare-precision FILE.py:Class --precision 16-mixed --steps 200`: float32 against a lower precision."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ktrainer.cli.fit import load_module_class

__all__ = ["add_parser", "ModuleFromTarget"]


def add_parser(commands: Any) -> None:
    """Register the `compare-precision` command."""
    parser = commands.add_parser(
        "compare-precision", help="train float32 and a lower precision on the same data and seed; compare",
        description="Train FILE.py:Class twice (32-true and --precision) with the same data and seed and report "
                    "the loss gap, non-finite and skipped steps, the steps/s ratio, each run's peak memory (each "
                    "trains in a process of its own) and a verdict. "
                    "Exits 1 when the verdict is 'diverges'.")
    parser.add_argument("target", help="FILE.py:ClassName or package.module:ClassName")
    parser.add_argument("--precision", default="16-mixed")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the comparison (default 10%%)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="mean relative loss gap for 'tracks'")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default="runs/compare-precision",
                        help="TensorBoard logs of both runs, and a PNG of both loss curves (with matplotlib)")
    parser.add_argument("--module-kwargs", default="{}", type=json.loads)
    parser.set_defaults(run=run)


@dataclass(frozen=True)
class ModuleFromTarget:
    """Builds the module of `FILE.py:ClassName` where it is called: in each run's own process.

    A class loaded from a file cannot be pickled by name (its file is not importable), so each
    run's process is sent this, which loads the class again there.
    """

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        """A new module."""
        return load_module_class(self.target)(**self.kwargs)


def _absolute(target: str) -> str:
    location, _, class_name = target.rpartition(":")
    return f"{os.path.abspath(location)}:{class_name}" if location.endswith(".py") else target


def run(args: argparse.Namespace) -> int:
    """Run the comparison and print its report."""
    from ktrainer.compare_precision import compare_precision

    load_module_class(args.target)  # a wrong target fails here, with its message
    make_module = ModuleFromTarget(_absolute(args.target), args.module_kwargs)
    result = compare_precision(make_module, args.precision, steps=args.steps,
                               warmup=args.warmup, tolerance=args.tolerance, root=args.root,
                               batch_size=args.batch_size, seed=args.seed)
    print(result.report())
    return 1 if result.verdict == "diverges" else 0
