"""What one save writes: the files of a state, the common manifest fields and the saver's own."""

from __future__ import annotations

import json

import keras
import pytest

from ktrainer.checkpoint.lineage import MAX_LINEAGE, RunIdentity
from ktrainer.checkpoint.payload import checkpoint_payload

pytestmark = pytest.mark.both_backends

SAVE = "0123456789ab-7"


def state(step: int = 12) -> dict:
    return {"progress": {"global_step": step, "epoch": 1, "batch_in_epoch": 4},
            "run": {"hparams": {"lr": 0.1}, "global_batch_size": 64, "precision": "bf16-mixed"}}


def test_the_common_fields_describe_the_state_and_the_savers_own_are_added():
    run = RunIdentity()
    run.lineage = [f"{n:012x}" for n in range(MAX_LINEAGE + 5)] + [run.run_id]
    files, fields = checkpoint_payload(state(), keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), run,
                                       SAVE, {"reason": "manual", "monitor": "val/loss"})
    assert {key: fields[key] for key in ("step", "epoch", "batch_in_epoch", "run_id", "save_id", "hparams",
                                         "global_batch_size", "precision", "reason", "monitor")} == {
        "step": 12, "epoch": 1, "batch_in_epoch": 4, "run_id": run.run_id, "save_id": SAVE, "hparams": {"lr": 0.1},
        "global_batch_size": 64, "precision": "bf16-mixed", "reason": "manual", "monitor": "val/loss"}
    assert fields["lineage"] == run.lineage[-MAX_LINEAGE:] and fields["lineage"][-1] == run.run_id
    assert set(fields["versions"]) == {"ktrainer", "keras", keras.config.backend()}
    config = json.loads(files[f"model_config.{SAVE}.json"])
    assert config["class_name"] == "Sequential"  # what `ktrainer ckpt export` rebuilds the model from


class Unconfigurable(keras.Model):
    def __init__(self, width):  # no get_config for its argument: Keras cannot serialise it
        super().__init__()
        self.dense = keras.layers.Dense(width)

    def call(self, x):
        return self.dense(x)


def test_a_model_without_a_config_is_saved_without_one():
    files, _ = checkpoint_payload(state(), Unconfigurable(2), RunIdentity(), SAVE, {})
    assert not any(name.startswith("model_config") for name in files)
