"""Public names of a package loaded on first use (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: dict[str, str], before_load: Callable[[], None] | None = None,
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` for names defined in its modules.

    Args:
        package: The package's `__name__`.
        homes: Each public name -> the module that defines it; a name equal to its module's last
            part and defined nowhere else (`"callbacks": "ktrainer.callbacks"`) is that module.
        before_load: Called before the first load (e.g. a check of the environment).
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before_load is not None:
            before_load()
        home = importlib.import_module(homes[name])
        value = home if homes[name] == f"{package}.{name}" and not hasattr(home, name) else getattr(home, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
