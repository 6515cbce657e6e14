"""The FLOPs of a JAX function's matrix products and convolutions, counted from its jaxpr: exact for each
primitive, through the structures a training step is traced into (jit, scan, cond, while, remat, custom
derivatives), and equal to the textbook count for an MLP's training step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from ktrainer.backends.jax.flops import matmul_flops

pytestmark = pytest.mark.jax_only


def spec(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_a_matrix_product_is_two_flops_per_multiply_add():
    assert matmul_flops(jnp.matmul, spec(16, 64), spec(64, 32)) == 2 * 16 * 64 * 32


def test_batched_products_count_every_batch():
    batched = lambda a, b: jnp.einsum("bij,bjk->bik", a, b)  # noqa: E731
    assert matmul_flops(batched, spec(3, 4, 5), spec(3, 5, 6)) == 2 * 3 * 4 * 5 * 6


def test_a_convolution_counts_each_output_times_its_kernel_window():
    def conv(x, kernel):
        return jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    assert matmul_flops(conv, spec(2, 8, 8, 3), spec(3, 3, 3, 16)) == 2 * (2 * 8 * 8 * 16) * (3 * 3 * 3)


def test_a_grouped_convolution_counts_the_channels_each_group_sees():
    def depthwise(x, kernel):
        return jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            feature_group_count=4)

    assert matmul_flops(depthwise, spec(1, 5, 5, 4), spec(3, 3, 1, 4)) == 2 * (1 * 3 * 3 * 4) * (3 * 3 * 1)


def test_a_strided_convolutions_input_gradient_counts_what_its_forward_pass_does():
    def forward(x, kernel):
        return jax.lax.conv_general_dilated(x, kernel, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    x, kernel = spec(1, 16, 16, 4), spec(3, 3, 4, 8)
    once = matmul_flops(forward, x, kernel)
    assert once == 2 * (8 * 8 * 8) * (3 * 3 * 4)
    # the forward pass, then the input's gradient: a convolution over the output gradient dilated by the stride
    assert matmul_flops(jax.grad(lambda x, k: jnp.sum(forward(x, k))), x, kernel) == 2 * once


def test_elementwise_work_is_not_counted():
    assert matmul_flops(lambda x: jnp.tanh(x) * 2 + 1, spec(100, 100)) == 0


def test_a_scan_counts_its_body_once_per_iteration_and_jit_is_looked_into():
    def body(carry, x):
        return jax.jit(jnp.matmul)(carry, x), None

    scanned = lambda carry, xs: jax.lax.scan(body, carry, xs)[0]  # noqa: E731
    assert matmul_flops(scanned, spec(4, 8), spec(5, 8, 8)) == 5 * 2 * 4 * 8 * 8


def test_a_cond_counts_its_costliest_branch_and_a_while_loop_its_body_once():
    def cond(flag, a, b):
        return jax.lax.cond(flag, lambda: a @ b @ b, lambda: a @ b)

    assert matmul_flops(cond, jax.ShapeDtypeStruct((), jnp.bool_), spec(4, 8), spec(8, 8)) == 2 * 2 * 4 * 8 * 8

    def loop(a, b):
        return jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] @ b, c[1] + 1), (a, 0))[0]

    assert matmul_flops(loop, spec(4, 8), spec(8, 8)) == 2 * 4 * 8 * 8


def test_remat_and_custom_derivatives_are_counted_with_their_recomputation():
    @jax.custom_vjp
    def product(a, b):
        return a @ b

    product.defvjp(lambda a, b: (a @ b, (a, b)), lambda saved, g: (g @ saved[1].T, saved[0].T @ g))

    def loss(a, b):
        return jnp.sum(jax.checkpoint(lambda a: jnp.tanh(product(a, b)))(a))

    one = 2 * 4 * 8 * 8
    # forward; under remat the backward recomputes the forward, then the two gradient products of the rule
    assert matmul_flops(jax.grad(loss, argnums=(0, 1)), spec(4, 8), spec(8, 8)) == 4 * one


def test_an_mlp_training_step_counts_forward_weight_gradients_and_input_gradients_past_the_first_layer():
    sizes, batch = [(32, 64), (64, 64), (64, 16)], 8

    def loss(weights, x):
        for kernel in weights:
            x = jnp.tanh(x @ kernel)
        return jnp.mean(x**2)

    weights = [spec(*shape) for shape in sizes]
    forward = sum(2 * batch * a * b for a, b in sizes)
    input_gradients = sum(2 * batch * a * b for a, b in sizes[1:])  # the data's gradient is never computed
    assert matmul_flops(jax.grad(loss), weights, spec(batch, 32)) == 2 * forward + input_gradients
