"""A checkpoint of format 1 (ktrainer 0.1.0) is verified with its SHA-256 checksums and resumes exactly as 0.1.0 did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

import ktrainer as kt
from ktrainer.checkpoint import FsspecCheckpointIO
from ktrainer.utils.fs import Location

DATA = Path(__file__).with_name("data") / "format1"


class Tiny(kt.Module):
    def build(self):
        return keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.Adam(0.01)

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))

    def train_data(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(40, 3)).astype("float32")
        return x, x.sum(axis=1)


class Losses(kt.callbacks.Callback):
    def __init__(self, early):
        self.losses, self.early, self.restored = [], early, None

    def on_fit_start(self, trainer, module):
        self.restored = (self.early.best, self.early.wait)

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.losses.append(metrics["train/loss_step"])


@pytest.mark.filterwarnings("ignore:Resuming. the checkpoint has state")  # 0.1.0's ModelCheckpoint, logger: not here
def test_a_format_1_checkpoint_is_listed_verified_and_resumes_as_the_version_that_wrote_it(tmp_path):
    shutil.copytree(DATA / "step-00000007", tmp_path / "checkpoints" / "step-00000007")
    io = FsspecCheckpointIO(Location(str(tmp_path / "checkpoints")))
    [info] = io.list(checksums=True)
    assert info.valid and info.manifest.format_version == 1 and info.manifest.files[0].algorithm == "sha256"
    early = kt.callbacks.EarlyStopping(monitor="train/loss_epoch", patience=5)
    losses = Losses(early)
    trainer = kt.Trainer(max_steps=10, batch_size=8, seed=1, default_root_dir=str(tmp_path), logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, callbacks=[early, losses])
    module = Tiny()
    trainer.fit(module, ckpt_path="last")
    reference = json.loads((DATA / "reference.json").read_text())
    np.testing.assert_allclose(losses.losses, reference["losses"], rtol=0, atol=1e-6)
    for variable, expected in zip(module.model.trainable_variables, reference["weights"], strict=True):
        np.testing.assert_allclose(np.asarray(variable), expected, rtol=0, atol=1e-6)
    assert losses.restored == (6.817367458343506, 1)  # EarlyStopping's state came back under its new key
