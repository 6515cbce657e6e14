"""Every public name the README, docs/ and examples/ use exists where they say: a user who copies an import or a
`kt.` name from them never meets an ImportError or AttributeError, and a class the user docs name is public."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
USER_DOCUMENTS = [doc for doc in DOCUMENTS if doc.name not in {"architecture.md", "benchmarks.md", "changelog.md"}]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
PUBLIC_NAMESPACES = ("ktrainer", "ktrainer.callbacks", "ktrainer.loggers", "ktrainer.precision", "ktrainer.checkpoint",
                     "ktrainer.demos")
DOTTED = re.compile(r"(?<![\w/.])(kt|ktrainer)((?:\.[A-Za-z_]\w*)+)")


def resolve(dotted: str) -> Any:
    """The object a dotted name means: its longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def dotted_names() -> list[tuple[str, str]]:
    """(document, name) of every `kt.` or `ktrainer.` dotted name in the README and docs/ (the changelog
    names old module paths on purpose); `kt.` is `ktrainer.`."""
    found = set()
    for document in DOCUMENTS:
        if document.name == "changelog.md":
            continue
        for _prefix, rest in DOTTED.findall(_text(document)):
            found.add((document.name, f"ktrainer{rest}".rstrip(".")))
    return sorted(found)


def api_targets() -> list[str]:
    """Every `::: dotted.name` the API reference (docs/api/*.md) generates a page section from."""
    return sorted({target for page in API_PAGES for target in re.findall(r"^::: ([\w.]+)", _text(page), re.M)})


def python_imports() -> list[tuple[str, str]]:
    """(where, dotted name) of every ktrainer import in the docs' python blocks and in examples/."""
    sources = [(doc.name, block) for doc in DOCUMENTS for block in re.findall(r"```python\n(.*?)```", _text(doc), re.S)]
    sources += [(path.name, _text(path)) for path in sorted((ROOT / "examples").rglob("*.py"))]
    found = set()
    for where, code in sources:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue  # a fragment ("..."), checked by its page's own tests where it is runnable
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update((where, alias.name) for alias in node.names if alias.name.startswith("ktrainer"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ktrainer"):
                found.update((where, f"{node.module}.{alias.name}") for alias in node.names)
    return sorted(found)


@pytest.mark.parametrize(("document", "name"), dotted_names())
def test_a_dotted_name_in_the_docs_resolves(document, name):
    resolve(name)


@pytest.mark.parametrize("target", api_targets())
def test_every_api_reference_target_resolves(target):
    resolve(target)


@pytest.mark.parametrize(("where", "name"), python_imports())
def test_every_ktrainer_import_in_docs_and_examples_works(where, name):
    resolve(name)


def _public_names() -> set[str]:
    names = {target.rsplit(".", 1)[-1] for target in api_targets()}
    for namespace in PUBLIC_NAMESPACES:
        names.update(importlib.import_module(namespace).__all__)
    return names


def _defined_in_ktrainer() -> set[str]:
    names = set()
    for path in (ROOT / "ktrainer").rglob("*.py"):
        names.update(node.name for node in ast.walk(ast.parse(_text(path)))
                     if isinstance(node, ast.ClassDef | ast.FunctionDef) and not node.name.startswith("_"))
    return names


def test_every_ktrainer_class_the_user_docs_name_is_public():
    defined, public = _defined_in_ktrainer(), _public_names()
    private = sorted({(doc.name, name) for doc in USER_DOCUMENTS
                      for name in re.findall(r"`([A-Z][A-Za-z0-9]+)[(`.]", _text(doc))
                      if name in defined and name not in public})
    assert private == [], "named in the user docs but neither exported nor in the API reference"


def test_the_checks_find_names_in_the_docs():
    # a check over nothing would pass: these are names the docs are known to use
    assert ("README.md", "ktrainer.Trainer") in dotted_names()
    assert "ktrainer.Trainer" in api_targets()
    assert any(name == "ktrainer.precision.MixedPrecision" for _, name in python_imports())
    with pytest.raises(AttributeError):
        resolve("ktrainer.callbacks.NoSuchCallback")
