"""`ktrainer compare-precision FILE.py:Class --precision 16-mixed --steps 200`: float32 against a lower precision."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ktrainer.cli.fit import load_module_class

__all__ = ["add_parser"]


def add_parser(commands: Any) -> None:
    """Register the `compare-precision` command."""
    parser = commands.add_parser(
        "compare-precision", help="train float32 and a lower precision on the same data and seed; compare",
        description="Train FILE.py:Class twice (32-true and --precision) with the same data and seed and report "
                    "the loss gap, non-finite and skipped steps, the steps/s ratio, peak memory and a verdict. "
                    "Exits 1 when the verdict is 'diverges'.")
    parser.add_argument("target", help="FILE.py:ClassName or package.module:ClassName")
    parser.add_argument("--precision", default="16-mixed")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the comparison (default 10%%)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="mean relative loss gap for 'tracks'")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default="runs/compare-precision", help="TensorBoard logs of both runs")
    parser.add_argument("--module-kwargs", default="{}", type=json.loads)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the comparison and print its report."""
    from ktrainer.compare_precision import compare_precision

    module_class = load_module_class(args.target)
    result = compare_precision(lambda: module_class(**args.module_kwargs), args.precision, steps=args.steps,
                               warmup=args.warmup, tolerance=args.tolerance, root=args.root,
                               batch_size=args.batch_size, seed=args.seed)
    print(result.report())
    return 1 if result.verdict == "diverges" else 0
