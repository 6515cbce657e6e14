"""In a fresh process with 2 logical CPUs: model.fit under MirroredStrategy and Trainer(devices=2) from the same start.

Prints a JSON object: the largest weight difference, the epoch losses and validation metrics of both sides.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ktrainer as kt  # noqa: E402
from tests.parity.harness import from_weights  # noqa: E402
from tests.parity.test_fit_parity import FraudPort, fraud_model  # noqa: E402


def main() -> None:
    trainer = kt.Trainer(max_epochs=2, batch_size=16, devices=2, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False)  # splits the CPU into 2 logical devices, before TF starts
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype("float32")
    y = (x[:, 0] + 0.3 * x[:, 1] > 1.2).astype("float32")[:, None]
    xv = rng.normal(size=(45, 6)).astype("float32")  # 45: the last global batch of 13 splits unevenly
    yv = (xv[:, 0] + 0.3 * xv[:, 1] > 1.2).astype("float32")[:, None]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = fraud_model()
        initial = [keras.ops.convert_to_numpy(v) for v in model.variables]
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                      metrics=[keras.metrics.Precision(name="precision"), keras.metrics.Recall(name="recall"),
                               keras.metrics.AUC(name="auc")])
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, validation_data=(xv, yv),
                        validation_batch_size=32)
    module = from_weights(FraudPort, initial)()
    module.make_optimizer = lambda: keras.optimizers.Adam(0.01)
    ours = trainer.fit(module, train_data=(x, y), val_data=(xv, yv), shuffle=False)
    difference = max(float(np.abs(a - b).max()) for a, b in zip(module.model.get_weights(), model.get_weights(),
                                                                  strict=True))
    print(json.dumps({"replicas": trainer.strategy.num_replicas_in_sync, "max_weight_difference": difference,
                      "keras": history.history, "ours": ours.history}))


if __name__ == "__main__":
    main()
