"""Argument checks shared by the Trainer, callbacks and loggers: each error says what, expected, how to fix."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["check_choice", "check_int", "check_count_or_fraction", "check_bool",
           "check_storage_options", "check_path", "optional", "check_fast_dev_run"]


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return `value` if it is one of `allowed`.

    Raises:
        ValueError: Naming the argument, the bad value and every allowed one.
    """
    allowed = list(allowed)
    if value not in allowed:
        listed = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name}={value!r} is not supported. Use one of: {listed}.")
    return value


def check_int(name: str, value: Any, *, minimum: int, allow_none: bool = False) -> int | None:
    """Return `value` if it is an int >= `minimum` (or None when allowed).

    Raises:
        ValueError: If it is not an int or is below `minimum`.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an int >= {minimum}{extra}, got {value!r}.")
    return value


def check_count_or_fraction(name: str, value: Any, *, allow_zero: bool = False) -> int | float:
    """Return `value` if it is a batch count (int) or a fraction of an epoch (float in (0, 1]).

    Raises:
        ValueError: If it is neither.
    """
    minimum = 0 if allow_zero else 1
    if isinstance(value, bool):
        pass
    elif isinstance(value, int) and value >= minimum:
        return value
    elif isinstance(value, float) and (0.0 < value <= 1.0 or (allow_zero and value == 0.0)):
        return value
    raise ValueError(
        f"{name} must be an int >= {minimum} (a number of batches) or a float in "
        f"{'[0' if allow_zero else '(0'}, 1] (a fraction of the epoch), got {value!r}."
    )


def defines_hook(module: Any, hook: str, base: type) -> bool:
    """True when the Module's class overrides `hook` of `base`."""
    return getattr(type(module), hook) is not getattr(base, hook)


def check_bool(name: str, value: Any) -> bool:
    """Return `value` if it is a bool.

    Raises:
        ValueError: Naming the argument and the value given.
    """
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")
    return value


def check_storage_options(name: str, value: Any) -> dict[str, Any]:
    """Return fsspec storage options as a dict (None -> {}).

    Raises:
        ValueError: If `value` is not a mapping with string keys.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ValueError(
            f"{name} must be a dict of fsspec options (e.g. {{'key': ..., 'secret': ..., 'client_kwargs': "
            f"{{'endpoint_url': ...}}}}) or None, got {value!r} ({type(value).__name__})."
        )
    return dict(value)


def check_path(name: str, value: Any, *, allow_none: bool = False) -> str | None:
    """Return a path or URL argument as a string (os.PathLike accepted).

    Raises:
        ValueError: If it is not a non-empty string or path (or None when allowed).
    """
    if value is None and allow_none:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a non-empty path or URL string{extra}, got {value!r} "
                         f"({type(value).__name__}).")
    return value


def optional(check: Any, name: str, value: Any, **kwargs: Any) -> Any:
    """Run `check` on `value` unless it is None."""
    return None if value is None else check(name, value, **kwargs)


def check_fast_dev_run(value: Any) -> int:
    """fast_dev_run as a batch count: True -> 1, False -> 0."""
    if value is True:
        return 1
    if value is False:
        return 0
    return check_int("fast_dev_run", value, minimum=0)
