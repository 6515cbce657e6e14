"""One leg of a resume test, in a fresh process.

    python resume_run.py ROOT MAX_STEPS PRECISION [CKPT] [OPTIONS_JSON] [--seed N|none] [--accumulate N]
                         [--every-n-steps N] [--async-save] [--report]

Prints, with --report, a line `step N` after every training batch and `saved URL` after every
committed checkpoint (flushed: the tests wait on them). At the end, a JSON object: the (step,
loss) pairs it trained, the path of its final weights, its step and epoch, the loss scale.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import keras
import numpy as np

import ktrainer as kt


class Net(kt.Module):
    """Dropout (random state), Adam (slots), numpy data (shuffled per epoch), validation."""

    def build(self):
        return keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dropout(0.3), keras.layers.Dense(3, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.Adam(0.01)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def validation_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, self.model(x), from_logits=True))

    def train_data(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(160, 6)).astype("float32")
        return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0.5).astype("int32")

    def val_data(self):
        x, y = self.train_data()
        return x[:40], y[:40]


class SaveAndStop(kt.callbacks.Callback):
    """Saves a checkpoint after training batch `batch` of the run (mid accumulation group, say), then stops."""

    def __init__(self, batch: int):
        self.batch, self.seen = batch, 0

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.seen += 1
        if self.seen == self.batch:
            trainer.save_checkpoint()
            trainer.should_stop = True


class Losses(kt.callbacks.Callback):
    """Records each step's loss; with `report`, prints each step and each committed checkpoint."""

    def __init__(self, report: bool = False):
        self.losses = []
        self.report = report
        self._saved = None

    def on_train_batch_end(self, trainer, module, metrics, batch_idx):
        self.losses.append([trainer.global_step, metrics["train/loss_step"]])
        if self.report:
            saved = trainer.checkpoint_callback.last_saved if trainer.checkpoint_callback else None
            if saved != self._saved:
                self._saved = saved
                print(f"saved {saved}", flush=True)
            print(f"step {trainer.global_step}", flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("precision")
    parser.add_argument("ckpt", nargs="?", default="-")
    parser.add_argument("options", nargs="?", default="{}")
    parser.add_argument("--seed", default="7")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--every-n-steps", type=int, default=None)
    parser.add_argument("--max-to-keep", type=int, default=3)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--save-and-stop-at-batch", type=int, default=None)
    parser.add_argument("--no-logger", dest="logger", action="store_false")
    return parser.parse_args(argv)


def train(argv: list[str]) -> dict:
    """Run one leg with these arguments; returns the losses, the final weights (bfloat16 as float32), the step,
    the epoch, the loss scale and the shuffle seed."""
    args = parse(argv)
    losses = Losses(report=args.report)
    callbacks = [losses]
    if args.save_and_stop_at_batch:
        callbacks.append(SaveAndStop(args.save_and_stop_at_batch))
    if args.every_n_steps or args.async_save:
        callbacks.insert(0, kt.callbacks.ModelCheckpoint(every_n_train_steps=args.every_n_steps,
                                                         max_to_keep=args.max_to_keep, async_save=args.async_save))
    trainer = kt.Trainer(max_steps=args.max_steps, batch_size=32, seed=None if args.seed == "none" else int(args.seed),
                         precision=args.precision, default_root_dir=args.root, callbacks=callbacks,
                         enable_progress_bar=False, log_every_n_steps=1, storage_options=json.loads(args.options),
                         accumulate_grad_batches=args.accumulate, logger=args.logger)
    module = Net()
    trainer.fit(module, ckpt_path=None if args.ckpt == "-" else args.ckpt)
    arrays = [np.asarray(v) for v in module.model.variables]
    scale = float(trainer.optimizer.dynamic_scale.numpy()) if args.precision == "16-mixed" else None
    return {"losses": losses.losses, "weights": [a.astype(np.float32) if a.dtype.name == "bfloat16" else a
                                                 for a in arrays],
            "step": trainer.global_step, "epoch": trainer.current_epoch, "scale": scale,
            "shuffle_seed": trainer.progress.shuffle_seed}


def main(argv: list[str]) -> None:
    result = train(argv)
    weights_file = os.path.abspath(f"weights-{os.getpid()}.npz")  # the test runs us in a temporary folder
    np.savez(weights_file, *result["weights"])
    print(json.dumps({**result, "weights": weights_file}))


if __name__ == "__main__":
    main(sys.argv[1:])
