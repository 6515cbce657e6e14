"""The README's quick start: a classifier Module, trained, validated and used for prediction."""

import keras
import numpy as np

import ktrainer as kt


class Classifier(kt.Module):
    def __init__(self, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(2048, 20)).astype("float32")
        self.y = (self.x[:, :3].argmax(axis=1)).astype("int32")   # a learnable 3-class rule

    def build(self):
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(3, dtype="float32")])

    def configure_optimizers(self):
        return keras.optimizers.Adam(self.lr)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x, training=True)
        loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        self.log("train/acc", keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits)), prog_bar=True)
        return loss

    def validation_step(self, batch):
        x, y = batch
        logits = self.model(x, training=False)
        self.log("val/acc", keras.ops.mean(keras.metrics.sparse_categorical_accuracy(y, logits)), prog_bar=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def train_data(self):
        return self.x[:1536], self.y[:1536]

    def val_data(self):
        return self.x[1536:], self.y[1536:]


def main(root: str = "runs/quickstart") -> dict:
    trainer = kt.Trainer(max_epochs=3, batch_size=32, seed=0, default_root_dir=root)
    module = Classifier(lr=1e-2)
    trainer.fit(module)
    metrics = trainer.validate(module)
    predictions = trainer.predict(module, module.x[:5])
    print("validation:", metrics)
    print("predicted classes:", predictions.argmax(axis=1), "true:", module.y[:5])
    print("step", trainer.global_step, "epoch", trainer.current_epoch, "logs in", trainer.logger.log_dir)
    return metrics


if __name__ == "__main__":
    main()
