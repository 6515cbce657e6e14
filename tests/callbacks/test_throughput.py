"""ThroughputMonitor: perf/ rates read back from TensorBoard, FLOPs counted by the engine, the peak table, wiring.

No timing is asserted: only relations between numbers logged at the same step.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.callbacks.throughput import peak_flops_per_device
from tests.helpers import Classifier, read_scalars

pytestmark = pytest.mark.both_backends

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
    per_batch = [flops[s] / batches[s] for s in sorted(flops)]
    assert per_batch[0] == pytest.approx(per_batch[1], rel=REL)  # one count, logged at each step
    matrix_product = 2 * 16 * 64 * 32
    if keras.config.backend() == "tensorflow":  # counted from the graph by the MFU convention: forward + 2x backward
        assert per_batch[0] == pytest.approx(3 * matrix_product, rel=REL)
    else:  # the step's matrix products, from its jaxpr: the forward product and the kernel's gradient (the data
        # needs none)
        assert per_batch[0] == pytest.approx(2 * matrix_product, rel=REL)


def test_no_logger_no_monitor():
    trainer = kt.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    assert not any(isinstance(c, kt.callbacks.ThroughputMonitor) for c in trainer.callbacks)


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
