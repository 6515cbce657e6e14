"""The Trainer's constructor signature and argument docs, read from its source without importing it.

Importing `ktrainer.trainer.trainer` imports Keras and TensorFlow, seconds of work; the command line's
`--help` must answer in well under a second. So the flags are derived from the source text of
`Trainer.__init__` and the class docstring (the same signature and docs users read in their
editor), and a test checks the result against the imported class.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["trainer_signature_stub", "UNSET"]

UNSET = inspect.Parameter.empty  # a default the source computes (the Trainer's own default applies)

# Modules whose constants may be defaults and which import neither Keras nor TensorFlow.
_LIGHT_MODULES = {"ktrainer.loop.preemption"}

# Names the annotations may use; any other name (Callback, Logger, Precision...) reads as Any.
_TYPE_NAMESPACE: dict[str, Any] = {"Any": Any, "Sequence": Sequence, "Callable": Callable,
                                   "int": int, "float": float, "str": str, "bool": bool, "dict": dict,
                                   "list": list, "type": type, "None": None, "Optional": typing.Optional}


def _annotation(node: ast.expr | None) -> Any:
    if node is None:
        return Any
    text = ast.unparse(node)
    try:
        return eval(text, {"__builtins__": {}}, _TYPE_NAMESPACE)  # noqa: S307 - type expressions of our own source
    except (NameError, TypeError):
        return Any


def _default(node: ast.expr | None, imported_from: dict[str, str]) -> Any:
    """A literal default, or a constant imported from a light ktrainer module (e.g. DEFAULT_SIGNALS)."""
    if node is None:
        return UNSET
    if isinstance(node, ast.Name) and imported_from.get(node.id) in _LIGHT_MODULES:
        return getattr(importlib.import_module(imported_from[node.id]), node.id)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return UNSET


def _imports(tree: ast.Module) -> dict[str, str]:
    """Each name a module imports with `from X import name` -> X."""
    return {alias.asname or alias.name: node.module for node in tree.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def trainer_signature_stub() -> Callable[..., None]:
    """A function with the signature and docstring of `ktrainer.Trainer`, built without importing it.

    Parameters whose default is computed in the source (e.g. `preemption_signals`) carry no default
    here: left unset on the command line, the Trainer's own default applies.
    """
    spec = importlib.util.find_spec("ktrainer.trainer.trainer")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    source = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Trainer")
    init = next(node for node in source.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    keyword_only, imported = init.args.kwonlyargs, _imports(tree)
    parameters = [
        inspect.Parameter(argument.arg, inspect.Parameter.KEYWORD_ONLY, annotation=_annotation(argument.annotation),
                          default=_default(default, imported))
        for argument, default in zip(keyword_only, init.args.kw_defaults, strict=True)
    ]

    def trainer(**arguments: Any) -> None:
        pass

    trainer.__signature__ = inspect.Signature(parameters)
    trainer.__doc__ = ast.get_docstring(source)
    return trainer
