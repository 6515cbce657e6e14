"""The Trainer's `accelerator` / `strategy` / `num_nodes` / `devices` arguments, checked the same way on every backend.

Each engine's `plan_devices` reads its own device facts (what is visible, which strategies it has, what a
strategy object is there) and leaves the checks the arguments share to this module, which imports neither
TensorFlow nor JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ktrainer.checks import check_choice, check_int

__all__ = ["ACCELERATORS", "check_device_arguments", "check_one_device", "chosen_indices", "is_keras_distribution"]

ACCELERATORS = ("auto", "cpu", "gpu", "tpu")


def check_device_arguments(accelerator: str, strategy: Any, num_nodes: int, strategies: Sequence[str],
                           strategy_object: Callable[[Any], bool]) -> bool:
    """Check `accelerator` and `num_nodes`, then `strategy`: an object the engine takes, or one of `strategies`.

    Args:
        accelerator: One of `ACCELERATORS`.
        strategy: A strategy name, or an object the engine judges.
        num_nodes: An int >= 1.
        strategies: The engine's strategy names.
        strategy_object: The engine's judge of `strategy`: True for an object it uses as it is, False for what
            must be a name; it raises for an object it refuses.

    Returns:
        True when `strategy` is such an object (its name is not checked), False for a name of `strategies`.

    Raises:
        ValueError: For an accelerator or strategy that is not one of the allowed, or num_nodes below 1.
    """
    check_choice("accelerator", accelerator, ACCELERATORS)
    check_int("num_nodes", num_nodes, minimum=1)
    if strategy_object(strategy):
        return True
    check_choice("strategy", strategy, strategies)
    return False


def check_one_device(strategy: str, devices: Any, count: int, several: str) -> None:
    """Refuse strategy "one_device" on several devices.

    Args:
        strategy: The strategy asked for.
        devices: The `devices` argument, as given (for the message).
        count: How many devices it names.
        several: The engine's strategy over several devices, named in the fix.

    Raises:
        ValueError: Naming `several`, "auto" and devices=1 as fixes.
    """
    if strategy == "one_device" and count > 1:
        raise ValueError(f"strategy='one_device' conflicts with devices={devices!r} ({count} devices). "
                         f"Use strategy={several!r} (or 'auto'), or devices=1.")


def chosen_indices(requested: list[int] | None, accelerator: str, visible: int | None,
                   too_few: Callable[[int], str]) -> list[int]:
    """The device indices a run uses: those requested, else every visible device of an accelerator (one on a CPU).

    Args:
        requested: The indices `devices` names (`requested_indices`), None for "auto".
        accelerator: "cpu", or the accelerator whose devices are counted in `visible`.
        visible: How many devices can be used (None: as many as asked for).
        too_few: The message for an index beyond what is visible, given the largest index asked for.

    Raises:
        ValueError: When an index requested is not visible, with `too_few`'s message.
    """
    if requested is None:
        return list(range(visible or 0)) if accelerator != "cpu" else [0]
    if visible is not None and max(requested) >= visible:
        raise ValueError(too_few(max(requested)))
    return requested


def is_keras_distribution(strategy: Any) -> bool:
    """Whether `strategy` is a Keras distribution object (`keras.distribution.ModelParallel`, `DataParallel`):
    told by its class's module, so neither engine imports the other's framework to ask."""
    return not isinstance(strategy, str) and type(strategy).__module__.startswith("keras")
