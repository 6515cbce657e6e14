"""Models bigger than one device: "fsdp" and "model_parallel" on 8 virtual CPU devices train the same losses as data
parallel on the same global batch, each device holding its slice of the weights and Adam's moments (read from the
arrays' shardings), and every layout mistake is refused before anything is trained or written.

Runs in the JAX session (tests/conftest.py starts JAX with 8 virtual CPU devices).
"""

from __future__ import annotations

import logging

import jax
import keras
import numpy as np
import pytest

import ktrainer as kt
from tests.backends.jax_engine.sharded_block import (
    GLOBAL_BATCH,
    MODEL_LAYOUT,
    WIDTH,
    TransformerBlock,
    data,
    fit,
    held_per_device,
)

pytestmark = pytest.mark.jax_only

@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory) -> list[float]:
    """The losses of data-parallel training on 8 devices, 8 examples each: the reference."""
    losses, trainer = fit(TransformerBlock(), tmp_path_factory.mktemp("dp"), batch_size=8, devices=8)
    assert trainer.engine.strategy_name() == "data_parallel"
    return losses


def test_fsdp_trains_the_losses_of_data_parallel_holding_an_eighth_of_the_state_per_device(data_parallel, tmp_path,
                                                                                         caplog):
    module = TransformerBlock()
    with caplog.at_level(logging.INFO, logger="ktrainer"):
        losses, trainer = fit(module, tmp_path, strategy="fsdp", devices=8, batch_size=8, fsdp_min_bytes=0)
    np.testing.assert_allclose(losses, data_parallel, atol=1e-5, rtol=0)
    assert trainer.global_batch_size == GLOBAL_BATCH
    device, whole = held_per_device(trainer, module)
    assert device <= (1 / 4 + 0.1) * whole
    assert device <= whole / 8 * 1.1  # all but the scalars split 8 ways
    embeddings = module.model.get_layer("emb").embeddings.value
    assert embeddings.sharding.spec == jax.sharding.PartitionSpec("batch", None)  # its largest dimension
    moment = next(v for v in trainer.optimizer.variables if "emb_embeddings_momentum" in v.path)
    assert moment.value.sharding.spec == embeddings.sharding.spec  # Adam's moments follow their variable
    (block,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fit:")]
    assert "8 x cpu, strategy fsdp, mesh batch=8" in block
    assert f"total {device / 2**10:.1f} KiB ({device / whole:.0%} of replicated)" in block
    assert f"total {whole / 2**10:.1f} KiB" in block.split("replicated ")[-1]


def test_fsdp_leaves_variables_below_the_threshold_replicated(tmp_path):
    module = TransformerBlock()
    _, trainer = fit(module, tmp_path, steps=1, strategy="fsdp", devices=8, batch_size=8, fsdp_min_bytes=4096)
    specs = {v.path: v.value.sharding.spec for v in module.model.variables}
    assert specs["emb/embeddings"] == jax.sharding.PartitionSpec("batch", None)  # 8 KiB
    assert specs["head/bias"] == jax.sharding.PartitionSpec(None)  # 256 bytes
    assert specs["ln/gamma"] == jax.sharding.PartitionSpec(None)


def test_a_configure_layout_over_a_2_by_4_mesh_trains_the_losses_of_data_parallel(data_parallel, tmp_path):
    module = TransformerBlock(MODEL_LAYOUT)
    losses, trainer = fit(module, tmp_path, strategy="model_parallel", mesh={"batch": 2, "model": 4},
                           batch_size=32)
    np.testing.assert_allclose(losses, data_parallel, atol=1e-5, rtol=0)
    assert (trainer.num_replicas, trainer.global_batch_size) == (2, GLOBAL_BATCH)  # per replica x the batch axis
    device, whole = held_per_device(trainer, module)
    assert device <= (1 / 4 + 0.1) * whole
    kernel = module.model.get_layer("up").kernel.value
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")
    assert kernel.addressable_shards[0].data.shape == (WIDTH, 2 * WIDTH // 4)


def test_a_keras_model_parallel_and_a_device_mesh_are_taken_as_they_are(data_parallel, tmp_path):
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), jax.devices()[:8])
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in MODEL_LAYOUT.items():
        layout_map[key] = axes
    distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    module = TransformerBlock()
    losses, trainer = fit(module, tmp_path, strategy=distribution, batch_size=32)
    np.testing.assert_allclose(losses, data_parallel, atol=1e-5, rtol=0)
    assert module.model.get_layer("up").kernel.value.sharding.spec == jax.sharding.PartitionSpec(None, "model")
    losses, _ = fit(TransformerBlock(MODEL_LAYOUT), tmp_path, strategy="model_parallel", mesh=mesh, batch_size=32)
    np.testing.assert_allclose(losses, data_parallel, atol=1e-5, rtol=0)


def test_accumulated_gradients_are_sharded_as_their_variables(tmp_path):
    module = TransformerBlock()
    reference, _ = fit(TransformerBlock(), tmp_path / "dp", steps=2, devices=8, batch_size=4,
                        accumulate_grad_batches=2)
    losses, trainer = fit(module, tmp_path / "fsdp", steps=2, strategy="fsdp", devices=8, batch_size=4,
                           accumulate_grad_batches=2, fsdp_min_bytes=0)
    np.testing.assert_allclose(losses, reference, atol=1e-5, rtol=0)
    sums = trainer.train_step.rules[0].sums
    embeddings = module.model.get_layer("emb").embeddings
    (total,) = [s for s, v in zip(sums, trainer.train_step.rules[0].variables, strict=True) if v is embeddings]
    assert total.value.sharding.spec == embeddings.value.sharding.spec == jax.sharding.PartitionSpec("batch", None)


@pytest.mark.parametrize(("layout", "says"), [
    ({"up/kernal": (None, "model")}, ["'up/kernal'", "match no variable", "nothing was trained or written"]),
    ({"up/kernel": (None, "model", None)}, ["'up/kernel'", "(32, 64)", "2 dimensions", "3 entries"]),
    ({"head/bias": ("model",), "emb/embeddings": ("batch", "model")}, []),  # fits: no error
    ({"ln/gamma": (("batch", "model"),)}, ["'ln/gamma'", "several axes", "one mesh axis (or None) per dimension"]),
    ({"mha/query/bias": ("mdl", None)}, ["axis 'mdl'", "('batch', 'model')"]),
    ({"up/kernel": ("model", "model")}, ["'up/kernel'", "one mesh axis for two dimensions"]),
])
def test_a_layout_that_does_not_fit_is_refused_naming_the_variable_before_anything_is_written(layout, says,
                                                                                             tmp_path):
    module = TransformerBlock(layout)
    trainer = kt.Trainer(max_steps=1, strategy="model_parallel", mesh={"batch": 2, "model": 4}, batch_size=32,
                         enable_progress_bar=False, default_root_dir=str(tmp_path))
    if not says:
        trainer.fit(module, data(), shuffle=False)
        return
    with pytest.raises(ValueError) as caught:
        trainer.fit(module, data(), shuffle=False)
    for part in says:
        assert part in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # no log, no checkpoint


def test_an_axis_that_does_not_divide_a_dimension_is_refused_naming_variable_shape_and_axis(tmp_path):
    module = TransformerBlock({"head/bias": ("model",), "ln/gamma": ("model",)})
    trainer = kt.Trainer(max_steps=1, strategy="model_parallel", mesh={"batch": 1, "model": 8}, batch_size=64,
                         enable_progress_bar=False, default_root_dir=str(tmp_path))
    module.layout = {"up/kernel": (None, "model"), "emb/embeddings": ("model", None), "head/kernel": ("model", None)}
    trainer.fit(module, data(), shuffle=False)  # 64 and 32 divide by 8
    module = TransformerBlock({"mha/query/bias": ("model", None)})  # (4, 8): 4 heads on 8 devices
    with pytest.raises(ValueError) as caught:
        kt.Trainer(max_steps=1, strategy="model_parallel", mesh={"batch": 1, "model": 8}, batch_size=64,
                   enable_progress_bar=False, default_root_dir=str(tmp_path / "new")).fit(module, data())
    message = str(caught.value)
    for part in ("'mha/query/bias'", "(4, 8)", "'model'", "dimension 0 (4)", "8 parts"):
        assert part in message
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(("arguments", "says"), [
    ({"strategy": "model_parallel"}, ["needs a mesh", "{'batch': 2, 'model': 4}"]),
    ({"mesh": {"batch": 2, "model": 4}}, ["does not shard anything", "strategy='fsdp' or 'model_parallel'"]),
    ({"strategy": "fsdp", "mesh": {"model": 8}}, ["'batch' axis", "['model']"]),
    ({"strategy": "model_parallel", "mesh": {"batch": 2, "model": 4}, "devices": 4}, ["spans 8 devices", "has 4"]),
    ({"strategy": "model_parallel", "mesh": {"batch": 0}}, ["size 0", "int >= 1"]),
    ({"strategy": "model_parallel", "mesh": [2, 4]}, ["axis names and sizes"]),
    ({"strategy": "fsdp", "fsdp_min_bytes": -1}, ["fsdp_min_bytes"]),
])
def test_a_mesh_that_cannot_be_is_refused_when_the_trainer_is_made(arguments, says):
    with pytest.raises(ValueError) as caught:
        kt.Trainer(**arguments)
    for part in says:
        assert part in str(caught.value)


def test_a_layout_hook_that_returns_no_layout_is_refused():
    module = TransformerBlock(["up/kernel"])
    with pytest.raises(TypeError, match="configure_layout"):
        kt.Trainer(max_steps=1, strategy="model_parallel", mesh={"batch": 2, "model": 4}, batch_size=32,
                   enable_progress_bar=False, logger=False).fit(module, data())


def test_devices_k_trains_on_device_k(tmp_path):
    module = TransformerBlock()
    _, trainer = fit(module, tmp_path, steps=2, devices=[3], batch_size=8)
    device = jax.local_devices()[3]
    assert {d for v in module.model.variables for d in v.value.devices()} == {device}
    assert {d for v in trainer.optimizer.variables for d in v.value.devices()} == {device}


def test_mfu_counts_every_device_of_the_mesh_not_only_the_replicas(tmp_path):
    monitor = kt.callbacks.ThroughputMonitor(flops_per_step=1e9, peak_flops_per_device=1e12)
    _, trainer = fit(TransformerBlock(MODEL_LAYOUT), tmp_path, steps=2, strategy="model_parallel",
                     mesh={"batch": 2, "model": 4}, batch_size=32, callbacks=[monitor])
    metrics = trainer.callback_metrics
    assert trainer.num_replicas == 2 and trainer.engine.device_count == 8
    assert float(metrics["perf/mfu_epoch"]) == pytest.approx(float(metrics["perf/flops_per_sec_epoch"]) / 8e12,
                                                           rel=1e-4)
