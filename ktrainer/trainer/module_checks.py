"""Checks of a user's Module that catch silent mistakes before anything is built or written."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras

from ktrainer.checks import defines_hook
from ktrainer.module import Module, module_runtime
from ktrainer.utils.logs import warn_user

__all__ = ["check_module_hooks", "check_layers_created_in_build", "warn_val_data_without_validation_step"]


def check_module_hooks(module: Any, hooks: Iterable[str]) -> None:
    """Check that `module` is a Module whose class overrides `hooks` and whose `__init__` called `super().__init__()`.

    Raises:
        TypeError: Naming what is not a Module, the missing `super().__init__()` call or the missing hook.
    """
    cls = type(module)
    if not isinstance(module, Module):
        raise TypeError(f"Trainer needs a ktrainer.Module, got {cls.__name__}. Subclass kt.Module.")
    module_runtime(module)  # raises when its __init__ skipped super().__init__()
    for hook in hooks:
        if not defines_hook(module, hook, Module):
            raise TypeError(f"{cls.__name__} does not define {hook}(), which the Trainer needs. "
                            f"Override {hook} in your Module.")


def _found_in(value: Any, kinds: tuple[type, ...]) -> list[Any]:
    """The objects of `kinds` that an attribute holds: itself, or the items of a list, tuple or dict."""
    if isinstance(value, dict):
        value = list(value.values())
    items = list(value) if isinstance(value, list | tuple) else [value]
    return [item for item in items if isinstance(item, kinds)]


def _held(module: Any, kinds: tuple[type, ...]) -> list[str]:
    return [f"self.{name} ({type(found).__name__})" for name, value in vars(module).items()
            if not name.startswith("_") for found in _found_in(value, kinds)]


def check_layers_created_in_build(module: Any) -> None:
    """A Keras model, layer, metric or variable found on a Module that was never built was created outside `build()`.

    Created there, it misses the precision policy (a layer computes in float32 under "16-mixed") and the
    strategy's scope or mesh (its variables live on one device; with `devices=2` TensorFlow fails obscurely,
    and a metric's state misses the other replicas).

    Raises:
        TypeError: Naming the attributes and saying to move them into `build()`.
    """
    if module.model is not None and module.model is module_runtime(module).built_model:
        return  # built by an earlier fit/validate/test: its layers are the model's
    found = _held(module, (keras.layers.Layer,))
    if found:
        name = type(module).__name__
        raise TypeError(
            f"{name} holds Keras layers created before the Trainer built it: {', '.join(found)}. Create them in "
            f"{name}.build() instead (return the model from build(); sub-layers may be assigned to self there): "
            "the Trainer sets the precision policy and enters the devices' strategy scope just before build(), so "
            "a layer made in __init__ computes in float32 under '16-mixed' and cannot be placed on several devices. "
            "A layer that only prepares data (used in train_data(), outside the model) may stay: give it a name "
            "that starts with '_', e.g. self._normalize."
        )
    state = _held(module, (keras.metrics.Metric, keras.Variable))
    if state:
        name = type(module).__name__
        raise TypeError(
            f"{name} holds Keras metrics or variables created before the Trainer built it: {', '.join(state)}. "
            f"Create them in {name}.build() instead (assign them to self there): the Trainer enters the devices' "
            "strategy scope or mesh just before build(), and a metric or variable made in __init__ lives on one "
            "device outside it, so on several devices its state misses the other replicas."
        )


def warn_val_data_without_validation_step(module: Any, base: type) -> bool:
    """Warn (once per fit) when validation data is given but the Module defines no `validation_step`.

    Returns:
        True when validation can run.
    """
    if defines_hook(module, "validation_step", base):
        return True
    warn_user(f"Validation data was given, but {type(module).__name__} defines no validation_step(), so "
              "validation is skipped. Define validation_step(self, batch) to validate (or pass no val_data).")
    return False
