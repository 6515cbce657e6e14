"""The README's quick start, verbatim (tests/test_docs_run.py checks they are the same): a classifier
Module trained for 3 epochs, then resumed from its last checkpoint up to epoch 5, and validated."""

import keras
import numpy as np

import ktrainer as kt


class Classifier(kt.Module):
    def __init__(self, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()              # logged to TensorBoard's HPARAMS tab
        self.lr = lr

    def build(self):                             # called by the Trainer; becomes self.model
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(3, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.Adam(self.lr)

    def training_step(self, batch):              # runs inside the compiled step
        x, y = batch
        logits = self.model(x, training=True)
        self.log("train/acc", keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits)), prog_bar=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def validation_step(self, batch):
        x, y = batch
        logits = self.model(x)
        self.log("val/acc", keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits)), prog_bar=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


rng = np.random.default_rng(0)                   # a learnable 3-class rule on 20 features
x = rng.normal(size=(2048, 20)).astype("float32")
y = x[:, :3].argmax(axis=1).astype("int32")
x_train, y_train, x_val, y_val = x[:1536], y[:1536], x[1536:], y[1536:]

trainer = kt.Trainer(max_epochs=3, batch_size=32, seed=0, default_root_dir="runs/exp1")
trainer.fit(Classifier(lr=1e-2), train_data=(x_train, y_train), val_data=(x_val, y_val))

# later, or after a crash, in a new process: continue exactly where the run stopped, up to epoch 5
trainer = kt.Trainer(max_epochs=5, batch_size=32, seed=0, default_root_dir="runs/exp1")
module = Classifier(lr=1e-2)
trainer.fit(module, train_data=(x_train, y_train), val_data=(x_val, y_val), ckpt_path="last")
print(trainer.validate(module, (x_val, y_val)))  # {'val/acc': 0.957..., 'val/loss': 0.110...} on TF
