"""TensorFlow: FLOPs of a training step, counted statically from the traced forward graph; the GPU's name."""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

__all__ = ["training_flops", "forward_flops", "graph_flops", "gpu_name", "tf32_enabled"]

# Ops whose body is another function: a static count of the outer graph cannot see (or, for a loop,
# multiply) the work inside, so a graph holding one is not counted at all rather than undercounted.
_CALLS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase", "PartitionedCall",
                    "StatefulPartitionedCall"})
_MATMULS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
_CONVS = frozenset({"Conv2D", "Conv3D"})
_TRANSPOSED_CONVS = frozenset({"Conv2DBackpropInput", "Conv3DBackpropInputV2"})


def gpu_name() -> str | None:
    """The name of the first GPU TensorFlow sees (all of a run's GPUs are assumed alike); None without one."""
    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name") if gpus else None


def tf32_enabled() -> bool:
    """Whether float32 matrix products may run in TensorFloat-32."""
    return bool(tf.config.experimental.tensor_float_32_execution_enabled())


def training_flops(model: keras.Model, batch_size: int) -> float | None:
    """FLOPs of one training step of `model` on `batch_size` examples: 3 x its forward FLOPs.

    The factor 3 is the convention of MFU papers (PaLM, Megatron): the backward pass costs twice the
    forward (a gradient for the inputs and one for the weights of every product). The forward FLOPs
    are counted by `forward_flops`; see there for what is counted, and when it returns None.
    """
    forward = forward_flops(model, batch_size)
    return None if forward is None else 3.0 * forward


def forward_flops(model: keras.Model, batch_size: int) -> float | None:
    """FLOPs of `model(x, training=True)` on `batch_size` examples, counted in its traced TensorFlow graph.

    The model is traced (not run) on its declared inputs with the batch dimension set. Counted: 2 per
    multiply-add of every matrix product (MatMul, BatchMatMul, Einsum: Dense, EinsumDense, attention)
    and convolution (Conv1D/2D/3D, depthwise, separable, transposed), from the ops' static shapes.
    Elementwise ops, normalisation, softmax, pooling and embedding lookups count 0, as in MFU papers.

    Returns:
        The FLOPs, or None when they cannot be counted: a model without declared inputs (subclassed),
        an input with an unknown dimension besides the batch, or a forward pass with loops,
        conditionals or nested functions (an RNN's loop), whose ops a static count cannot see.
    """
    structure = _declared_inputs(model)
    if structure is None:
        return None
    specs = [tf.TensorSpec((batch_size, *each.shape[1:]), each.dtype) for each in keras.tree.flatten(structure)]
    if any(None in spec.shape.as_list() for spec in specs):
        return None

    def forward(*tensors: tf.Tensor) -> Any:
        return model(keras.tree.pack_sequence_as(structure, tensors), training=True)

    graph = tf.function(forward).get_concrete_function(*specs).graph
    return graph_flops(graph)


def _declared_inputs(model: keras.Model) -> Any:
    """The model's symbolic inputs, in the structure it is called with; None when it declares none."""
    try:
        return model.input
    except (AttributeError, ValueError):  # a Sequential that was never called itself; a subclassed model
        inputs = getattr(model, "inputs", None)
        return (inputs[0] if len(inputs) == 1 else inputs) if inputs else None


def graph_flops(graph: tf.Graph) -> float | None:
    """The matrix-product and convolution FLOPs of a graph's ops (see `forward_flops`); None if not countable."""
    total = 0
    for op in graph.get_operations():
        if op.type in _CALLS:
            return None
        flops = _op_flops(op)
        if flops is None:
            return None
        total += flops
    return float(total)


def _op_flops(op: tf.Operation) -> int | None:
    """2 x the multiply-adds of one op (0 for ops not counted); None when a shape it needs is unknown."""
    if op.type in _MATMULS:
        return _matmul_flops(op)
    if op.type in _CONVS or op.type == "DepthwiseConv2dNative":
        return _conv_flops(op)
    if op.type in _TRANSPOSED_CONVS:
        return _transposed_conv_flops(op)
    if op.type == "Einsum":
        return _einsum_flops(op)
    return 0


def _dims(tensor: tf.Tensor) -> list[int] | None:
    if tensor.shape.rank is None:
        return None
    dims = tensor.shape.as_list()
    return None if None in dims else dims


def _matmul_flops(op: tf.Operation) -> int | None:
    left, out = _dims(op.inputs[0]), _dims(op.outputs[0])
    if left is None or out is None:
        return None
    transposed = op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x")
    return 2 * math.prod(out) * left[-2 if transposed else -1]


def _conv_flops(op: tf.Operation) -> int | None:
    kernel, out = _dims(op.inputs[1]), _dims(op.outputs[0])
    if kernel is None or out is None:
        return None
    # Each output value sums window x input channels products; a depthwise output sees one input channel.
    per_output = math.prod(kernel[:-2]) if op.type == "DepthwiseConv2dNative" else math.prod(kernel[:-1])
    return 2 * math.prod(out) * per_output


def _transposed_conv_flops(op: tf.Operation) -> int | None:
    kernel, small = _dims(op.inputs[1]), _dims(op.inputs[2])
    if kernel is None or small is None:
        return None
    # Counted from the input side: each input value is multiplied into window x output channels values,
    # which is exact at the borders (counting from the larger output side is not).
    return 2 * math.prod(small) * math.prod(kernel[:-1])


def _einsum_flops(op: tf.Operation) -> int | None:
    operands, result = op.get_attr("equation").decode().replace(" ", "").split("->")
    terms = operands.split(",")
    if len(terms) != 2:
        return 0  # one operand: a transpose, trace or sum, no multiply-adds
    sizes: dict[str, int] = {}
    for term, tensor in zip(terms, op.inputs, strict=True):
        dims = _dims(tensor)
        if dims is None:
            return None
        head, _, tail = term.partition("...")
        sizes.update(zip(head, dims[:len(head)], strict=True))
        sizes.update(zip(tail, dims[len(dims) - len(tail):], strict=True))
    out = _dims(op.outputs[0])
    if out is None:
        return None
    contracted = (set(terms[0]) | set(terms[1])) - set(result) - {"."}
    return 2 * math.prod(out) * math.prod(sizes[letter] for letter in contracted)


# ----- the callback -----------------------------------------------------------------------------
