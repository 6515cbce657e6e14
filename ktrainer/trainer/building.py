"""Building a module under the Trainer: the precision policy, the device scope, the model, then its optimizers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import keras

from ktrainer.backends.accelerators import hardware_advice
from ktrainer.module import module_runtime
from ktrainer.precision.float32_layers import float32_at_construction, keep_float32
from ktrainer.precision.report import check_output_dtype, output_dtypes
from ktrainer.trainer.lr_scaling import scale_learning_rate
from ktrainer.trainer.module_checks import check_layers_created_in_build

__all__ = ["BuiltOptimizers", "build_model", "build_optimizers", "configured_optimizers"]

log = logging.getLogger("ktrainer")


@dataclass
class BuiltOptimizers:
    """The optimizers of a fit.

    Attributes:
        configured: The optimizers `configure_optimizers()` returned, in its order.
        wrapped: The same, each wrapped by the precision (for loss scaling): what the step updates with.
        lr_factor: What the learning rates were multiplied by (`lr_scaling`; 1.0 when not scaled).
    """

    configured: list
    wrapped: list
    lr_factor: float


def build_model(module: Any, precision: Any, float32_layers: list, engine: Any) -> None:
    """Set the precision policy, and build the module's model in the engine's scope (unless it has one).

    The output dtype is checked afterwards: a model that ends in float16 under mixed precision is
    warned about, naming the layer to create with dtype="float32".

    Raises:
        TypeError: When `build()` returns something other than a keras.Model, or layers were created
            outside `build()`.
    """
    check_layers_created_in_build(module)
    keras.config.set_dtype_policy(precision.policy)
    engine.distribute(module)
    with engine.scope():
        if module.model is None:
            with float32_at_construction(float32_layers) as matched:
                model = module.build()
            if not isinstance(model, keras.Model):
                raise TypeError(f"{type(module).__name__}.build() returned {type(model).__name__}; it must return "
                                "a keras.Model (e.g. keras.Sequential([...])).")
            module.model = module_runtime(module).built_model = model
            unmatched = [s for s in float32_layers if s not in matched]
            if unmatched:  # names Keras gave: known only now
                keep_float32(model, unmatched)
    dtypes, layers = output_dtypes(module.model)
    check_output_dtype(dtypes, precision.name, precision.compute_dtype, layers)


def build_optimizers(module: Any, precision: Any, engine: Any, lr_scaling: str | None) -> BuiltOptimizers:
    """Configure the module's optimizers in the engine's scope, wrap them for the precision, scale their rates.

    Also warns when the precision does not suit the accelerators this process sees.

    Raises:
        TypeError: When `configure_optimizers()` returns no keras optimizers (see `configured_optimizers`).
    """
    lr_factor = 1.0
    with engine.scope():
        returned = module.configure_optimizers()
        configured = configured_optimizers(returned, module)
        module_runtime(module).configured_optimizers = returned
        wrapped = [precision.wrap_optimizer(each) for each in configured]
        for each in wrapped:
            lr_factor = scale_learning_rate(each, lr_scaling, engine.replicas)
    for line in hardware_advice(precision.name, precision.compute_dtype, engine.visible_accelerators()):
        log.warning(line)
    return BuiltOptimizers(configured, wrapped, lr_factor)


def configured_optimizers(configured: Any, module: Any) -> list[keras.optimizers.Optimizer]:
    """The optimizers `configure_optimizers()` returned (one, a list or a dict), as a list, checked.

    Raises:
        TypeError: For anything that is not keras optimizers, or several under automatic optimization.
    """
    name = type(module).__name__
    optimizers = list(configured.values()) if isinstance(configured, dict) else (
        list(configured) if isinstance(configured, list | tuple) else [configured])
    if not optimizers or not all(isinstance(each, keras.optimizers.Optimizer) for each in optimizers):
        raise TypeError(f"{name}.configure_optimizers() returned {configured!r}; it must return a keras optimizer, "
                        "e.g. keras.optimizers.Adam(1e-3), or (with manual optimization) a list or dict of them.")
    if len(optimizers) > 1 and module.automatic_optimization:
        raise TypeError(f"{name}.configure_optimizers() returned {len(optimizers)} optimizers, but the Trainer steps "
                        "one by itself. Set automatic_optimization = False in the module and make each update in "
                        "training_step with self.manual_step(loss_fn, optimizer, variables).")
    return optimizers
