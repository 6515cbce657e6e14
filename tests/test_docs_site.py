"""The documentation site builds with `mkdocs build --strict`, and its API reference comes from the docstrings."""

from __future__ import annotations

import ast
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("callbacks", "loggers", "checkpoint", "precision")  # subpackages with an API page


def _text(page: Path) -> str:
    """The visible text of a built page: tags dropped, entities decoded, whitespace collapsed."""
    text = re.sub(r"</?(code|a|span|em|strong)\b[^>]*>", "", page.read_text(encoding="utf-8"))  # inline
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def _words(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def _exports(init: Path) -> list[str]:
    """`__all__` of a module, read from its source (importing ktrainer would start TensorFlow)."""
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{init} has no __all__")


def _docstring(path: Path, cls: str, method: str) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    func = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return ast.get_docstring(func)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}\n{result.stdout}"
    return site_dir


def test_the_api_reference_is_generated_from_the_docstrings(site):
    trainer_page = _text(site / "api" / "trainer" / "index.html")
    assert "then run epochs of training (and validation) until a limit" in trainer_page
    # whatever Trainer.fit's docstring says today: its summary and its ckpt_path description are on the page
    doc = _docstring(ROOT / "ktrainer" / "trainer" / "trainer.py", "Trainer", "fit")
    summary = _words(doc.splitlines()[0])
    assert summary in trainer_page
    ckpt = re.search(r"ckpt_path: (.*?)\n\s+\w+:", doc, re.S).group(1)
    assert _words(ckpt) in trainer_page


def test_every_exported_name_has_an_entry_in_the_api_reference(site):
    ids = set()
    for page in (site / "api").rglob("index.html"):
        ids.update(re.findall(r'id="(ktrainer\.[\w.]+)"', page.read_text(encoding="utf-8")))
    missing = []
    for name in _exports(ROOT / "ktrainer" / "__init__.py"):
        if name == "__version__" or (ROOT / "ktrainer" / name / "__init__.py").exists():
            continue  # the subpackages are checked name by name below
        if f"ktrainer.{name}" not in ids and not any(re.fullmatch(rf"ktrainer\.\w+\.{name}", i) for i in ids):
            missing.append(f"ktrainer.{name}")
    for package in PACKAGES:
        for name in _exports(ROOT / "ktrainer" / package / "__init__.py"):
            if f"ktrainer.{package}.{name}" not in ids:
                missing.append(f"ktrainer.{package}.{name}")
    assert not missing, f"not in the API reference (docs/api/*.md): {missing}"


def test_the_changelog_page_includes_changelog_md(site):
    page = _text(site / "changelog" / "index.html")
    assert "--8<--" not in page
    first_entry = next(line for line in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
                       if line.startswith("- "))
    assert _words(first_entry[2:])[:60] in _words(page)
