"""The house's rules, read from the source (no import of ktrainer's rooms, no TensorFlow): docs/architecture.md
("Floors") and CONTRIBUTING.md state them, these tests keep them true.

- TensorFlow is imported only in `backends/tensorflow/` and `compat/`, JAX only in `backends/jax/` and `compat/`.
- Keras internals (`keras.src`, a private name of an object that is not ktrainer's) are read only in `compat/`.
- Only `module.py` touches the Module's private names; every other room goes through `module_runtime(module)`.
- Each room imports only rooms on its own floor or below, the rooms' imports have no cycle, and the two engines
  never import each other.

Each rule is a function of a package directory, so a test of the tests runs them on a small package that breaks
every rule once and checks that each breach is reported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "ktrainer"

FLOORS: tuple[tuple[str, frozenset[str]], ...] = (
    ("ground", frozenset({"utils", "compat", "version", "checks", "progress", "schedule", "data"})),
    ("parts", frozenset({"module", "precision", "checkpoint", "backends"})),
    ("step", frozenset({"step", "loggers", "callbacks"})),
    ("engines", frozenset({"backends/jax", "backends/tensorflow"})),
    ("loop", frozenset({"loop"})),
    ("trainer", frozenset({"trainer"})),
    ("face", frozenset({"__init__", "compare_precision", "demos", "cli"})),
)
FRAMEWORK_HOMES = {"tensorflow": ("backends/tensorflow", "compat"), "jax": ("backends/jax", "compat"),
                   "jaxlib": ("backends/jax", "compat")}
ENGINES = frozenset({"backends/jax", "backends/tensorflow"})
# Private names of other libraries that are their documented way in, with the reason.
ALLOWED_FOREIGN_PRIVATES = {"_getframe": "sys._getframe: CPython's frame access, how warn_user finds the caller"}


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is."""

    module: str
    where: str
    checked_at_runtime: bool  # False under `if TYPE_CHECKING:`: annotations only, never executed


def room_of(relative: Path) -> str:
    """The room a file belongs to: its top-level module or package, an engine's package under backends/."""
    parts = relative.with_suffix("").parts
    if parts[0] == "backends" and len(parts) > 2:
        return f"backends/{parts[1]}"
    return parts[0]


def room_of_module(name: str, package: str) -> str:
    """The room a dotted module name inside `package` belongs to (the package itself is the face, `__init__`)."""
    parts = name.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "backends" and len(parts) > 1 and parts[1] in {"jax", "tensorflow"}:
        return f"backends/{parts[1]}"
    return parts[0]


def sources(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    """Every Python file under `root`, relative to it, parsed."""
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root), ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for child in ast.walk(node))
    return inside


def imports_of(tree: ast.Module, relative: Path, root: Path) -> Iterator[Import]:
    """Every module `tree` imports, also inside functions; `from p import name` counts as `p.name` when
    `name` is a module of this package (so `from ktrainer import callbacks` is the callbacks room)."""
    type_checking = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', 0)}"
        runtime = id(node) not in type_checking
        if isinstance(node, ast.Import):
            yield from (Import(alias.name, where, runtime) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{where}: a relative import; ktrainer imports absolutely (`from ktrainer...`)")
            module = node.module or ""
            for alias in node.names:
                submodule = root.parent.joinpath(*f"{module}.{alias.name}".split("."))
                is_module = submodule.with_suffix(".py").exists() or submodule.is_dir()
                yield Import(f"{module}.{alias.name}" if is_module else module, where, runtime)


def framework_breaches(root: Path) -> list[str]:
    """TensorFlow or JAX imported outside its engine's package and compat/."""
    found = []
    for relative, tree in sources(root):
        room = room_of(relative)
        for each in imports_of(tree, relative, root):
            framework = each.module.split(".")[0]
            if framework in FRAMEWORK_HOMES and room not in FRAMEWORK_HOMES[framework]:
                found.append(f"{each.where}: imports {each.module} (only {' and '.join(FRAMEWORK_HOMES[framework])} "
                             "may)")
    return found


def _own_names(root: Path) -> set[str]:
    """Every name ktrainer defines: functions, classes, module-level names, attributes it assigns."""
    names: set[str] = set()
    for _, tree in sources(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def private_reads(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Private names read on another object: `x._name` (x not self, cls or super()) and getattr/hasattr/setattr
    with a literal "_name"; dunders are public protocol."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            own = isinstance(owner, ast.Name) and owner.id in {"self", "cls"}
            own = own or isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
            if not own:
                yield node.attr, node.lineno
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in {"getattr", "hasattr", "setattr"} and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            yield node.args[1].value, node.lineno


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def keras_internal_breaches(root: Path) -> list[str]:
    """`keras.src` imported, or a private name of another library's object read, outside compat/."""
    own = _own_names(root)
    found = []
    for relative, tree in sources(root):
        if room_of(relative) == "compat":
            continue
        found += [f"{each.where}: imports {each.module} (Keras internals live in compat/)"
                  for each in imports_of(tree, relative, root) if each.module.startswith("keras.src")]
        found += [f"{relative}:{line}: reads {name}, a private name that is not ktrainer's (wrap it in compat/)"
                  for name, line in private_reads(tree)
                  if _is_private(name) and name not in own and name not in ALLOWED_FOREIGN_PRIVATES]
    return found


def module_private_names(root: Path) -> set[str]:
    """The private names of the `Module` class in module.py: its private methods and `self._...` attributes."""
    tree = ast.parse((root / "module.py").read_text(encoding="utf-8"))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Module")
    names = {node.name for node in cls.body if isinstance(node, ast.FunctionDef) and _is_private(node.name)}
    names |= {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self" and _is_private(node.attr)}
    return names


def module_private_breaches(root: Path) -> list[str]:
    """A Module private name read or set outside module.py."""
    private = module_private_names(root)
    return [f"{relative}:{line}: touches Module.{name} (use module_runtime(module) from ktrainer.module)"
            for relative, tree in sources(root) if relative != Path("module.py")
            for name, line in private_reads(tree) if name in private]


def floor_of(room: str) -> int:
    """The floor a room is on (0 is the ground)."""
    for number, (_, rooms) in enumerate(FLOORS):
        if room in rooms:
            return number
    raise KeyError(room)


def room_imports(root: Path) -> dict[str, dict[str, str]]:
    """For each room, the rooms it imports at runtime, each with one place it does."""
    graph: dict[str, dict[str, str]] = {}
    for relative, tree in sources(root):
        room = room_of(relative)
        targets = graph.setdefault(room, {})
        for each in imports_of(tree, relative, root):
            if each.checked_at_runtime and each.module.split(".")[0] == root.name:
                target = room_of_module(each.module, root.name)
                if target != room:
                    targets.setdefault(target, each.where)
    return graph


def _cycle(graph: dict[str, dict[str, str]]) -> list[str]:
    """One cycle among the rooms, as a path that returns to its start, or []."""
    state: dict[str, str] = {}

    def visit(room: str, path: list[str]) -> list[str]:
        state[room] = "open"
        for target in sorted(graph.get(room, {})):
            if state.get(target) == "open":
                return [*path[path.index(target):], target] if target in path else [room, target]
            if target not in state:
                found = visit(target, [*path, target])
                if found:
                    return found
        state[room] = "done"
        return []

    for room in sorted(graph):
        if room not in state:
            found = visit(room, [room])
            if found:
                return found
    return []


def floor_breaches(root: Path) -> list[str]:
    """A room on no floor, an import up a floor, an engine importing the other, or a cycle among rooms."""
    graph = room_imports(root)
    placed = set().union(*(rooms for _, rooms in FLOORS))
    found = [f"{root.name}/{room}: on no floor (add it to FLOORS here and to docs/architecture.md)"
             for room in sorted(set(graph) - placed)]
    for room, targets in sorted(graph.items()):
        for target, where in sorted(targets.items()):
            if room not in placed or target not in placed:
                continue
            if floor_of(target) > floor_of(room):
                found.append(f"{where}: {room} (floor {FLOORS[floor_of(room)][0]}) imports {target}, a floor up "
                             f"({FLOORS[floor_of(target)][0]})")
            elif room in ENGINES and target in ENGINES:
                found.append(f"{where}: the engine {room} imports the engine {target}")
    cycle = _cycle(graph)
    if cycle:
        found.append(f"the rooms import each other in a cycle: {' -> '.join(cycle)} "
                     f"({graph[cycle[0]][cycle[1]]})")
    return found


RULES = (framework_breaches, keras_internal_breaches, module_private_breaches, floor_breaches)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.__name__)
def test_ktrainer_keeps_the_rule(rule):
    assert rule(PACKAGE) == []


def test_the_floors_in_docs_are_the_floors_tested():
    text = (REPOSITORY / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d) \| (\w+) \| ([^|]+) \|", text, flags=re.MULTILINE)
    documented = [(name, frozenset(room.strip(" `/") for room in rooms.split(","))) for _, name, rooms in rows]
    assert documented == [(name, rooms) for name, rooms in FLOORS]


def test_the_arrows_in_docs_are_the_imports_of_the_source():
    text = (REPOSITORY / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w/]+)` \| ([^|]+) \|$", text, flags=re.MULTILINE)
    documented = {room: set(re.findall(r"`([\w/]+)`", imports)) for room, imports in rows}
    assert documented == {room: set(targets) for room, targets in room_imports(PACKAGE).items()}


def test_every_room_of_ktrainer_is_on_a_floor():
    rooms = {room_of(relative) for relative, _ in sources(PACKAGE)}
    assert rooms == set().union(*(rooms for _, rooms in FLOORS))


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def broken_package(tmp_path):
    """A small package named ktrainer whose every file but the clean ones breaks one rule once."""
    return _write(tmp_path / "ktrainer", {
        "__init__.py": "from ktrainer.trainer import Trainer\n",
        "module.py": "class Module:\n    def __init__(self):\n        self._runtime = None\n\n"
                     "    def _take(self):\n        return self._runtime\n",
        "compat/__init__.py": "import tensorflow\nfrom keras.src import losses\n",  # allowed here
        "backends/__init__.py": "",
        "backends/jax/__init__.py": "import jax\nfrom ktrainer.backends.tensorflow import engine\n",
        "backends/tensorflow/__init__.py": "",
        "backends/tensorflow/engine.py": "import tensorflow as tf\n",
        "data/__init__.py": "import tensorflow as tf\n",
        "precision/__init__.py": "def rate(optimizer):\n    return optimizer._learning_rate\n",
        "loop/__init__.py": "from keras.src.utils import module_utils\nfrom ktrainer.trainer import Trainer\n",
        "step/__init__.py": "def stage(module):\n    return module._runtime.stage\n",
        "trainer/__init__.py": "from ktrainer import loop\n\ndef take(module):\n    return getattr(module, '_take')\n\n"
                               "class Trainer:\n    pass\n",
        "checks.py": "import sys\n\ndef caller():\n    return sys._getframe(1)\n",  # allowed: named with its reason
        "attic.py": "",
    })


def test_each_rule_reports_the_breach_planted_for_it(broken_package):
    assert framework_breaches(broken_package) == [
        "data/__init__.py:1: imports tensorflow (only backends/tensorflow and compat may)",
    ]
    assert keras_internal_breaches(broken_package) == [
        "loop/__init__.py:1: imports keras.src.utils (Keras internals live in compat/)",
        "precision/__init__.py:2: reads _learning_rate, a private name that is not ktrainer's (wrap it in compat/)",
    ]
    assert module_private_breaches(broken_package) == [
        "step/__init__.py:2: touches Module._runtime (use module_runtime(module) from ktrainer.module)",
        "trainer/__init__.py:4: touches Module._take (use module_runtime(module) from ktrainer.module)",
    ]
    assert floor_breaches(broken_package) == [
        "ktrainer/attic: on no floor (add it to FLOORS here and to docs/architecture.md)",
        "backends/jax/__init__.py:2: the engine backends/jax imports the engine backends/tensorflow",
        "loop/__init__.py:2: loop (floor loop) imports trainer, a floor up (trainer)",
        "the rooms import each other in a cycle: trainer -> loop -> trainer (trainer/__init__.py:1)",
    ]


def test_imports_for_annotations_only_are_not_floor_breaches(tmp_path):
    package = _write(tmp_path / "ktrainer", {
        "step/__init__.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                            "    from ktrainer.trainer import Trainer\n",
        "trainer/__init__.py": "from ktrainer import step\n",
    })
    assert floor_breaches(package) == []
