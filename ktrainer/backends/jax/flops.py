"""JAX: the FLOPs of a function's matrix products and convolutions, counted from its jaxpr.

MFU needs the FLOPs of the training step. XLA's cost analysis cannot give them on a GPU: a lowered
module's analysis is not implemented for PJRT plugins (CUDA among them), and a compiled module's leaves
out the matrix products XLA hands to cuBLAS (on an H200 it counted under 1% of a float32 MLP step's
FLOPs). The jaxpr is the same on every backend, so this count is too:

- `dot_general`: 2 x its multiply-adds; `conv_general_dilated`: 2 x output elements x the kernel's
  multiply-adds per output, over the input's dilation (its holes multiply nothing);
- inside `jit`, `scan` (times its length), remat, custom derivative rules and any other primitive
  that holds jaxprs; a `cond` counts its largest branch, a `while` loop its body once (its trip
  count is unknown until it runs);
- recomputation under remat is counted (it is work the device does); elementwise work is not, as
  MFU conventionally counts the matrix units' work. Not counted either: primitives that are not these
  two (a fused attention kernel such as cuDNN's), and a `shard_map` body counts one shard's shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import jax

__all__ = ["matmul_flops"]


def matmul_flops(function: Callable[..., Any], *args: Any) -> float:
    """FLOPs of the matrix products and convolutions `function(*args)` runs.

    Args:
        function: A JAX-traceable function.
        *args: Its arguments: arrays or `jax.ShapeDtypeStruct`s (nothing is computed).
    """
    return _jaxpr_flops(jax.make_jaxpr(function)(*args).jaxpr)


def _jaxpr_flops(jaxpr: Any) -> float:
    return sum(_equation_flops(equation) for equation in jaxpr.eqns)


def _equation_flops(equation: Any) -> float:
    name = equation.primitive.name
    if name == "dot_general":
        return _dot_flops(equation)
    if name == "conv_general_dilated":
        return _conv_flops(equation)
    if name == "cond":
        return max((_jaxpr_flops(branch) for branch in _jaxprs_in(equation.params["branches"])), default=0.0)
    inner = sum(_jaxpr_flops(sub) for sub in _jaxprs_in(list(equation.params.values())))
    return inner * equation.params["length"] if name == "scan" else inner


def _dot_flops(equation: Any) -> float:
    lhs, rhs = (variable.aval.shape for variable in equation.invars[:2])
    (_, rhs_contracting), (_, rhs_batch) = equation.params["dimension_numbers"]
    rhs_free = [size for dim, size in enumerate(rhs) if dim not in rhs_contracting and dim not in rhs_batch]
    return 2.0 * math.prod(lhs) * math.prod(rhs_free)


def _conv_flops(equation: Any) -> float:
    kernel = equation.invars[1].aval.shape
    out_features_dim = equation.params["dimension_numbers"].rhs_spec[0]
    per_output = math.prod(kernel) // kernel[out_features_dim]
    # A dilated input (a strided convolution's input gradient, a transposed convolution) is mostly holes:
    # only one window position in prod(dilation) meets a value.
    holes = math.prod(equation.params.get("lhs_dilation") or (1,))
    return 2.0 * math.prod(equation.outvars[0].aval.shape) * per_output / holes


def _jaxprs_in(value: Any) -> Iterator[Any]:
    """The jaxprs in a primitive's parameter (a jaxpr, a closed jaxpr, or a sequence of them)."""
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(getattr(value, "jaxpr", None), "eqns"):
        yield value.jaxpr
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _jaxprs_in(item)
