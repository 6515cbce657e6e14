"""ThroughputMonitor: perf/ rates read back from TensorBoard, FLOPs counted from graphs, the peak table, wiring.

No timing is asserted: only relations between numbers logged at the same step.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import ktrainer as kt
from ktrainer.backends.tensorflow.flops import forward_flops, graph_flops, training_flops
from ktrainer.callbacks.throughput import peak_flops_per_device
from tests.helpers import Classifier, read_scalars

L = keras.layers
REL = 1e-6  # TensorBoard stores float32: two roundings of ~6e-8 each


class Dense64(kt.Module):
    """Dense(64 -> 32) with a mean squared error: 2 * 16 * 64 * 32 forward FLOPs at batch 16."""

    def build(self):
        return keras.Sequential([L.Input((64,)), L.Dense(32)])

    def configure_optimizers(self):
        return keras.optimizers.SGD(0.01)

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x, training=True) - y))

    def train_data(self):
        rng = np.random.default_rng(0)
        return rng.normal(size=(128, 64)).astype(np.float32), rng.normal(size=(128, 32)).astype(np.float32)


def fit(tmp_path, module, **kwargs):
    trainer = kt.Trainer(default_root_dir=str(tmp_path), enable_progress_bar=False, enable_checkpointing=False,
                         **kwargs)
    trainer.fit(module)
    return trainer, read_scalars(str(tmp_path / "tensorboard" / "version_0"))


def test_default_fit_logs_rates_at_the_log_steps(tmp_path):
    trainer, scalars = fit(tmp_path, Classifier(), max_steps=8, batch_size=32, log_every_n_steps=2)
    assert sum(isinstance(c, kt.callbacks.ThroughputMonitor) for c in trainer.callbacks) == 1
    batches = dict(scalars["perf/batches_per_sec"])
    assert sorted(batches) == [2, 4, 6, 8]
    assert all(np.isfinite(v) and v > 0 for v in batches.values())
    assert dict(scalars["perf/samples_per_sec"]) == {s: pytest.approx(32 * v, rel=REL) for s, v in batches.items()}
    # 256 examples at 32 per batch: one epoch of 8 batches, its value logged at its end.
    (step, epoch_batches), = scalars["perf/batches_per_sec_epoch"]
    assert step == 8 and scalars["perf/samples_per_sec_epoch"] == [(8, pytest.approx(32 * epoch_batches, rel=REL))]
    # No accumulation: no optimizer-step rate; on CPU no peak: no FLOPs counted, no MFU.
    assert not {"perf/steps_per_sec", "perf/flops_per_sec", "perf/mfu"} & set(scalars)


class Ticker(kt.callbacks.Callback):
    """Moves a fake clock: 1 s per execution, 100 s per validation, 50 s between epochs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def on_train_batch_start(self, trainer, module, batch_idx):
        self.now += 1.0

    def on_validation_start(self, trainer, module):
        self.now += 100.0

    def on_train_epoch_start(self, trainer, module):
        self.now += 50.0


def test_compilation_validation_and_epoch_gaps_are_not_counted(tmp_path, monkeypatch):
    # A fake clock, not a timing: the Ticker runs after the monitor in each hook, so the monitor sees the
    # 1 s of every execution but not the first execution's, nor validation's 100 s, nor the 50 s between epochs.
    ticker = Ticker()
    monkeypatch.setattr("ktrainer.callbacks.throughput.perf_counter", ticker)
    _, scalars = fit(tmp_path, Classifier(), max_epochs=2, batch_size=32, log_every_n_steps=2, val_check_interval=4,
                     callbacks=[kt.callbacks.ThroughputMonitor(), ticker])
    assert scalars["perf/batches_per_sec"] == [(step, 1.0) for step in range(2, 17, 2)]
    assert scalars["perf/batches_per_sec_epoch"] == [(8, 1.0), (16, 1.0)]


def test_accumulation_adds_optimizer_steps_per_second(tmp_path):
    _, scalars = fit(tmp_path, Classifier(), max_steps=4, batch_size=32, log_every_n_steps=1,
                     accumulate_grad_batches=2)
    batches, steps = dict(scalars["perf/batches_per_sec"]), dict(scalars["perf/steps_per_sec"])
    assert sorted(steps) == [1, 2, 3, 4]
    # Step 1's interval holds batch 2 only (batch 1 compiled); later ones hold 2 batches per optimizer step.
    assert steps[1] == pytest.approx(batches[1], rel=REL)
    assert all(steps[s] == pytest.approx(batches[s] / 2, rel=REL) for s in (2, 3, 4))


def test_given_flops_and_peak_give_mfu(tmp_path):
    monitor = kt.callbacks.ThroughputMonitor(flops_per_step=1e9, peak_flops_per_device=1e12)
    trainer, scalars = fit(tmp_path, Classifier(), max_steps=6, batch_size=32, log_every_n_steps=3,
                           callbacks=[monitor])
    assert [c for c in trainer.callbacks if isinstance(c, kt.callbacks.ThroughputMonitor)] == [monitor]
    batches, flops, mfu = (dict(scalars[f"perf/{name}"]) for name in ("batches_per_sec", "flops_per_sec", "mfu"))
    assert sorted(mfu) == sorted(flops) == sorted(batches) == [3, 6]
    assert all(flops[s] == pytest.approx(1e9 * batches[s], rel=REL) for s in batches)
    assert all(mfu[s] == pytest.approx(flops[s] / 1e12, rel=REL) for s in batches)
    assert scalars["perf/mfu_epoch"][0][1] == pytest.approx(scalars["perf/flops_per_sec_epoch"][0][1] / 1e12, rel=REL)


def test_flops_are_counted_when_a_peak_is_given(tmp_path):
    monitor = kt.callbacks.ThroughputMonitor(peak_flops_per_device=1e12)
    _, scalars = fit(tmp_path, Dense64(), max_steps=4, batch_size=16, log_every_n_steps=2, callbacks=[monitor])
    batches, flops = dict(scalars["perf/batches_per_sec"]), dict(scalars["perf/flops_per_sec"])
    assert sorted(flops) == [2, 4]
    assert all(flops[s] / batches[s] == pytest.approx(6 * 16 * 64 * 32, rel=REL) for s in flops)


def test_no_logger_no_monitor():
    trainer = kt.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    assert not any(isinstance(c, kt.callbacks.ThroughputMonitor) for c in trainer.callbacks)


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


@pytest.mark.parametrize(("name", "precision", "tf32", "peak"), [
    ("NVIDIA A100-SXM4-80GB", "bf16-mixed", True, 312e12),
    ("NVIDIA A100-SXM4-80GB", "16-mixed", True, 312e12),
    ("NVIDIA A100-SXM4-80GB", "32-true", True, 156e12),
    ("NVIDIA A100-SXM4-80GB", "32-true", False, 19.5e12),
    ("NVIDIA H100 80GB HBM3", "bf16-mixed", True, 989e12),
    ("NVIDIA H200", "bf16-true", True, 989e12),
    ("Tesla V100-SXM2-16GB", "16-mixed", True, 125e12),
    ("Tesla V100-SXM2-16GB", "32-true", True, 15.7e12),  # no TF32 on V100: float32
    ("Tesla V100-SXM2-16GB", "bf16-mixed", True, None),  # no bfloat16 units
    ("NVIDIA L4", "bf16-mixed", True, 121e12),
    ("Tesla T4", "16-mixed", True, 65e12),
    ("NVIDIA L40S", "bf16-mixed", True, None),  # not in the table, nor mistaken for an L4
    ("NVIDIA A100-SXM4-80GB", "64-true", True, None),
])
def test_peak_table(name, precision, tf32, peak):
    assert peak_flops_per_device(name, precision, tf32) == peak


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "1e9"])
def test_bad_arguments(bad):
    with pytest.raises(ValueError, match="flops_per_step must be a positive number or None"):
        kt.callbacks.ThroughputMonitor(flops_per_step=bad)
