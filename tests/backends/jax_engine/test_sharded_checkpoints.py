"""Sharded checkpoints: a run on a (2, 4) mesh saves each distinct slice of each variable once, never the gathered
whole, and resumes exactly on a (4, 2) mesh, on (1, 8), under "fsdp" and on one device: the weights after the
resume equal those of a run that never stopped.

Runs in the JAX session (8 virtual CPU devices).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ktrainer.checkpoint.checksum import Checksum
from ktrainer.checkpoint.slices import SLICED
from ktrainer.checkpoint.tensors import read_tensors
from tests.backends.jax_engine.sharded_block import GLOBAL_BATCH, MODEL_LAYOUT, TransformerBlock, fit

pytestmark = pytest.mark.jax_only

MESHES = {"(4, 2)": {"strategy": "model_parallel", "mesh": {"batch": 4, "model": 2}, "batch_size": GLOBAL_BATCH // 4},
          "(1, 8)": {"strategy": "model_parallel", "mesh": {"batch": 1, "model": 8}, "batch_size": GLOBAL_BATCH},
          "fsdp on 8": {"strategy": "fsdp", "devices": 8, "batch_size": GLOBAL_BATCH // 8, "fsdp_min_bytes": 0},
          "one device": {"devices": 1, "batch_size": GLOBAL_BATCH}}


def _weights(module) -> list[np.ndarray]:
    return [np.asarray(v.value) for v in module.model.variables]


@pytest.fixture(scope="module")
def saved_on_2_by_4(tmp_path_factory):
    """A run on mesh (2, 4) saved at step 2 (its first epoch's end), and the weights of the same run straight to 4."""
    root = tmp_path_factory.mktemp("sharded")
    straight = TransformerBlock(MODEL_LAYOUT)
    fit(straight, root / "straight", steps=4, strategy="model_parallel", mesh={"batch": 2, "model": 4},
        batch_size=GLOBAL_BATCH // 2)
    fit(TransformerBlock(MODEL_LAYOUT), root / "run", steps=2, strategy="model_parallel",
        mesh={"batch": 2, "model": 4}, batch_size=GLOBAL_BATCH // 2, enable_checkpointing=True)
    return root / "run" / "checkpoints" / "step-00000002", _weights(straight)


def test_each_distinct_slice_is_written_once_with_its_place_in_the_whole(saved_on_2_by_4):
    checkpoint, _ = saved_on_2_by_4
    (state_file,) = checkpoint.glob("trainer.*.json")
    state = json.loads(state_file.read_text())
    kernel = next(value for key, value in state["model"].items() if key.endswith("up/kernel"))[SLICED]
    assert kernel["shape"] == [32, 64] and kernel["dtype"] == "float32"
    # Split 4 ways over "model" and replicated over "batch": 4 slices, not 8, each 16 columns wide.
    assert [part[2] for part in kernel["parts"]] == [[[0, 32], [c, c + 16]] for c in range(0, 64, 16)]
    moment = next(value for key, value in state["optimizer"].items() if key.endswith("up_kernel_momentum"))
    assert len(moment[SLICED]["parts"]) == 4  # Adam's moments are saved as sharded as their variable
    gamma = next(value for key, value in state["model"].items() if key.endswith("ln/gamma"))
    assert "__tensor__" in gamma  # a replicated variable is saved whole, once
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert {entry["name"] for entry in manifest["files"]} == {p.name for p in checkpoint.iterdir()} - {"manifest.json"}
    # The manifest alone says which file holds which slice of which variable (a tool reads no state file).
    held = {tensor: (file, shape, dtype, region, where) for file, entries in manifest["slices"].items()
            for tensor, shape, dtype, region, where in entries}
    assert set(manifest["slices"]) <= {entry["name"] for entry in manifest["files"]}
    for section, key, region in kernel["parts"]:
        file, shape, dtype, saved_region, where = held[f"{section}{key}"]
        assert (shape, dtype, saved_region) == ([32, 64], "float32", region)
        # Its byte range in its file, and that range's own checksum: a restore reads and checks the slice alone.
        data = (checkpoint / file).read_bytes()
        assert data[where["offset"]:where["offset"] + where["nbytes"]] == read_tensors(data)[key].tobytes()
        assert Checksum.of(data[where["offset"]:where["offset"] + where["nbytes"]]) == where["crc32c"]


@pytest.mark.parametrize("target", list(MESHES))
def test_a_checkpoint_of_a_2_by_4_mesh_resumes_exactly_on_another(saved_on_2_by_4, target, tmp_path):
    checkpoint, straight = saved_on_2_by_4
    module = TransformerBlock(MODEL_LAYOUT if MESHES[target].get("strategy") == "model_parallel" else None)
    _, trainer = fit(module, tmp_path, steps=4, ckpt_path=str(checkpoint), enable_checkpointing=True,
                     **MESHES[target])
    assert trainer.global_step == 4
    assert (tmp_path / "checkpoints" / "step-00000004" / "manifest.json").exists()  # it saves on its own mesh
    for resumed, stayed in zip(_weights(module), straight, strict=True):
        np.testing.assert_allclose(resumed, stayed, atol=1e-6, rtol=0)


def test_a_corrupt_slice_stops_the_resume_naming_it_and_what_to_do(saved_on_2_by_4, tmp_path):
    import shutil

    from ktrainer.checkpoint.io import CheckpointError

    checkpoint = tmp_path / "copy"
    shutil.copytree(saved_on_2_by_4[0], checkpoint)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    file, entries = next(iter(manifest["slices"].items()))
    tensor, *_, where = entries[-1]
    data = bytearray((checkpoint / file).read_bytes())
    data[where["offset"]] ^= 0x10  # one bit of one slice; every size stays right
    (checkpoint / file).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"slice {tensor} does not match its crc32c checksum \(corrupt\).*"
                                              r"Resume from an earlier checkpoint"):
        fit(TransformerBlock(), tmp_path / "run", steps=4, ckpt_path=str(checkpoint), enable_checkpointing=True,
            **MESHES["fsdp on 8"])
    assert not (tmp_path / "run" / "checkpoints").exists()  # it stopped before training: nothing was saved


def test_ckpt_export_writes_a_keras_file_of_a_sharded_checkpoint_one_variable_at_a_time(saved_on_2_by_4, tmp_path,
                                                                                         monkeypatch):
    import keras

    from ktrainer.checkpoint.slices import SavedSlices
    from ktrainer.cli.main import main

    checkpoint, _ = saved_on_2_by_4
    assembled: list[tuple[int, ...]] = []  # each sharded variable put together, in turn
    region = SavedSlices.region

    def watched(self, index=None):
        assembled.append(self.shape)
        return region(self, index)

    monkeypatch.setattr(SavedSlices, "region", watched)
    out = tmp_path / "model.keras"
    assert main(["ckpt", "export", str(checkpoint), str(out)]) == 0
    exported = keras.saving.load_model(str(out))
    state = json.loads(next(checkpoint.glob("trainer.*.json")).read_text())
    sliced = [value[SLICED]["shape"] for value in state["model"].values() if SLICED in value]
    assert assembled == [tuple(shape) for shape in sliced]  # each sharded model variable put together once, in turn
    module = TransformerBlock()  # the checkpoint's weights, loaded on one device
    fit(module, tmp_path / "resumed", steps=2, ckpt_path=str(checkpoint), devices=1, batch_size=GLOBAL_BATCH,
        enable_checkpointing=True)
    for mine, theirs in zip(module.model.get_weights(), exported.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_sharded_checkpoint_on_s3_and_gcs_resumes_exactly_on_another_mesh(saved_on_2_by_4, cloud_bucket):
    root, options = cloud_bucket
    _, straight = saved_on_2_by_4
    fit(TransformerBlock(MODEL_LAYOUT), f"{root}/run", steps=2, enable_checkpointing=True, storage_options=options,
        strategy="model_parallel", mesh={"batch": 2, "model": 4}, batch_size=GLOBAL_BATCH // 2)
    module = TransformerBlock()
    fit(module, f"{root}/run", steps=4, ckpt_path="last", enable_checkpointing=True, storage_options=options,
        **MESHES["fsdp on 8"])
    for resumed, stayed in zip(_weights(module), straight, strict=True):
        np.testing.assert_allclose(resumed, stayed, atol=1e-6, rtol=0)


def test_an_async_sharded_save_snapshots_each_slice_before_the_run_goes_on(saved_on_2_by_4, tmp_path):
    """A background save of a sharded state while the run trains on (the donated buffers are reused): resuming
    it on one device ends where a run that never stopped ends."""
    import ktrainer as kt

    _, straight = saved_on_2_by_4
    saver = kt.callbacks.ModelCheckpoint(every_n_train_steps=2, async_save=True, max_to_keep=None)
    fit(TransformerBlock(MODEL_LAYOUT), tmp_path / "run", steps=4, callbacks=[saver], enable_checkpointing=True,
        strategy="model_parallel",
        mesh={"batch": 2, "model": 4}, batch_size=GLOBAL_BATCH // 2)
    state = next((tmp_path / "run" / "checkpoints" / "step-00000002").glob("trainer.*.json")).read_text()
    assert SLICED in state
    module = TransformerBlock()
    fit(module, tmp_path / "resumed", steps=4, ckpt_path=str(tmp_path / "run" / "checkpoints" / "step-00000002"),
        callbacks=[kt.callbacks.ModelCheckpoint(every_n_train_steps=2, async_save=True, max_to_keep=None)],
        enable_checkpointing=True, **MESHES["one device"])
    for resumed, stayed in zip(_weights(module), straight, strict=True):
        np.testing.assert_allclose(resumed, stayed, atol=1e-6, rtol=0)
