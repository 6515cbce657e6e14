"""The TensorFlow engine's FLOP counter: matrix products counted from the traced graph, as TensorFlow's profiler."""

from __future__ import annotations

import keras
import tensorflow as tf

from ktrainer.backends.tensorflow.flops import forward_flops, graph_flops, training_flops

L = keras.layers


def test_dense_flops_equal_the_analytic_count():
    # Exact: only the matrix product is counted (2 per multiply-add, from static shapes); the bias,
    # the loss and the optimizer are elementwise and not counted, by the MFU convention.
    model = keras.Sequential([L.Input((64,)), L.Dense(32)])
    assert forward_flops(model, 16) == 2 * 16 * 64 * 32
    assert training_flops(model, 16) == 3 * 2 * 16 * 64 * 32


def test_conv_and_attention_flops_equal_the_analytic_count():
    conv = keras.Sequential([L.Input((8, 8, 3)), L.Conv2D(4, 3, padding="same"), L.DepthwiseConv2D(3),
                             L.Conv2DTranspose(2, 3, strides=2)])
    # Conv2D: each of 8x8x4 outputs is 3x3x3 multiply-adds; depthwise: 6x6x4 outputs of 3x3; transposed:
    # each of the 6x6x4 inputs is multiplied into 3x3x2 outputs.
    per_example = 8 * 8 * 4 * 27 + 6 * 6 * 4 * 9 + 6 * 6 * 4 * 18
    assert forward_flops(conv, 2) == 2 * 2 * per_example
    tokens = L.Input((6, 8))
    attention = keras.Model(tokens, L.MultiHeadAttention(num_heads=2, key_dim=4)(tokens, tokens))
    projections = 4 * 6 * 8 * (2 * 4)  # query, key, value (8 -> 2 heads x 4) and output (2 x 4 -> 8), per token
    scores_and_mix = 2 * 2 * 6 * 6 * 4  # two heads: 6x6 scores of 4-vectors, and 6x6 weights times 4-vectors
    assert forward_flops(attention, 3) == 2 * 3 * (projections + scores_and_mix)


def test_counted_ops_agree_with_tensorflows_profiler():
    model = keras.Sequential([L.Input((8, 8, 3)), L.Conv2D(4, 3), L.DepthwiseConv2D(3), L.Flatten(), L.Dense(5)])
    graph = tf.function(lambda x: model(x, training=True)).get_concrete_function(tf.TensorSpec((4, 8, 8, 3))).graph
    builder = tf.compat.v1.profiler.ProfileOptionBuilder
    options = builder(builder.float_operation()).with_empty_output().build()
    profiled = tf.compat.v1.profiler.profile(graph, options=options)
    counted_types = {"Conv2D", "DepthwiseConv2dNative", "MatMul"}
    expected = sum(child.float_ops for child in profiled.children
                   if graph.get_operation_by_name(child.name).type in counted_types)
    assert expected > 0 and graph_flops(graph) == expected


def test_flops_that_cannot_be_counted_are_none():
    assert forward_flops(keras.Sequential([L.Input((5, 3)), L.LSTM(4)]), 2) is None  # a While loop
    assert forward_flops(keras.Sequential([L.Input((None,)), L.Embedding(10, 4), L.Dense(2)]), 2) is None
    assert forward_flops(Subclassed(), 2) is None


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = L.Dense(2)

    def call(self, x):
        return self.dense(x)
