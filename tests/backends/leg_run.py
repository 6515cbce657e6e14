"""One training leg on whichever backend this process runs (KERAS_BACKEND), for the cross-backend and JAX tests.

    python leg_run.py JSON_ARGUMENTS

Arguments (JSON): root, max_steps or max_epochs, ckpt (None or "last" or a URL), precision, devices,
batch_size, steps_per_execution, accumulate, clip, initial_scale, storage_options, logger, seed, width, strategy
(e.g. "fsdp"), fsdp_min_bytes.
Prints one JSON line: the (step, loss) pairs trained, the weights after each batch as a user's
callback saw them (the last one), the final weights, step, epoch, skipped steps, loss scale, backend.
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np

import ktrainer as kt


class Net(kt.Module):
    """Dense - BatchNorm (non-trainable state) - Dense, Adam; no dropout, so every backend computes the same."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.width = width

    def build(self):
        return keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(self.width, activation="relu"),
                                 keras.layers.BatchNormalization(), keras.layers.Dense(3, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.Adam(0.01)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def validation_step(self, batch):
        x, y = batch
        logits = self.model(x, training=False)
        self.log("val/acc", keras.ops.mean(keras.ops.cast(keras.ops.argmax(logits, -1) == y, "float32")))
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def data(n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x[:, 0] + x[:, 1] > 0).astype("int32") + (x[:, 2] > 1).astype("int32")


class Record(kt.callbacks.Callback):
    """What a user's callback sees after each batch: the step's loss and the model's weights."""

    def __init__(self):
        self.losses, self.weights, self.initial = [], None, None

    def on_fit_start(self, trainer, module):
        self.initial = [np.asarray(w).tolist() for w in module.model.get_weights()]

    def on_train_batch_end(self, trainer, module, outputs, batch_idx):
        self.losses.append((trainer.global_step, float(outputs["train/loss_step"])))
        self.weights = [np.asarray(w).tolist() for w in module.model.get_weights()]


def leg(args: dict) -> dict:
    precision = args.get("precision", "32-true")
    if args.get("initial_scale"):
        precision = kt.precision.MixedPrecision(precision, initial_scale=args["initial_scale"])
    record = Record()
    trainer = kt.Trainer(
        max_steps=args.get("max_steps"), max_epochs=args.get("max_epochs"), batch_size=args.get("batch_size", 8),
        precision=precision, devices=args.get("devices", 1), seed=args.get("seed", 0),
        strategy=args.get("strategy", "auto"), fsdp_min_bytes=args.get("fsdp_min_bytes", 2**20),
        steps_per_execution=args.get("steps_per_execution", 1), accumulate_grad_batches=args.get("accumulate", 1),
        gradient_clip_val=args.get("clip"), default_root_dir=args["root"], callbacks=[record],
        storage_options=args.get("storage_options"), logger=args.get("logger", False), enable_progress_bar=False,
        log_every_n_steps=1)
    module = Net(args.get("width", 16))
    x, y = data()
    trainer.fit(module, (x, y), (x[:40], y[:40]), ckpt_path=args.get("ckpt"))
    scale = trainer.callback_metrics.get("precision/loss_scale")
    return {"backend": keras.config.backend(), "losses": record.losses, "seen_weights": record.weights,
            "initial_weights": record.initial,
            "weights": [np.asarray(w).tolist() for w in module.model.get_weights()], "step": trainer.global_step,
            "epoch": trainer.current_epoch, "skipped": trainer.skipped_steps, "loss_scale": scale,
            "val": {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
            "tensorflow_imported": "tensorflow" in sys.modules, "replicas": trainer.num_replicas}


if __name__ == "__main__":
    if keras.config.backend() == "jax":
        import jax

        jax.config.update("jax_num_cpu_devices", 4)  # one process runs legs on 1, 2 and 4 devices
    legs = json.loads(sys.argv[1])
    print(json.dumps([leg(each) for each in (legs if isinstance(legs, list) else [legs])]))
