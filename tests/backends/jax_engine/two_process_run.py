"""One of two JAX processes started by `ktrainer launch --nodes 2` (see test_two_processes.py).

    python no_tensorflow.py two_process_run.py ROOT

Prints `RESULT {json}`: its process index, replicas, step, whether it is the chief, its weights, the most
calls it held in flight; then a
second fit under `train_time_interval` whose chief's clock runs 25 s per execution while the other
process's runs true: `CLOCK {json}`, the saves each process took part in.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

import ktrainer as kt
import ktrainer.backends.jax.runners as jax_runners
import ktrainer.loop.run_clock

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.backends.leg_run
from tests.backends.leg_run import Net, data  # noqa: E402

in_flight: list[int] = []  # the calls the training runner held in flight, at each dispatch
_dispatch = jax_runners.TrainRunner.dispatch


def _watched_dispatch(self, *args, **kwargs):
    call = _dispatch(self, *args, **kwargs)
    in_flight.append(self._in_flight)
    return call


jax_runners.TrainRunner.dispatch = _watched_dispatch

# No num_nodes: the launcher's variables say this process is one of two, as TF_CONFIG does on TensorFlow.
trainer = kt.Trainer(max_epochs=2, batch_size=8, seed=0, default_root_dir=sys.argv[1],
                     enable_progress_bar=False, logger=True)
module = Net()
x, y = data()
trainer.fit(module, (x, y))
print("RESULT", json.dumps({"process": jax.process_index(), "replicas": trainer.num_replicas,
                            "step": trainer.global_step, "chief": trainer.is_global_zero,
                            "most_in_flight": max(in_flight),
                            "last_model_path": trainer.checkpoint_callback.last_model_path,
                            "weights": [np.asarray(w).tolist() for w in module.model.get_weights()],
                            "tensorflow_imported": "tensorflow" in sys.modules}), flush=True)


class FastClock:
    """The chief's clock, skewed: 25 s pass between two readings (the other process's clock runs true)."""

    def __init__(self):
        self.seconds = 0.0

    def monotonic(self) -> float:
        self.seconds += 25.0
        return self.seconds


class SavesSeen(kt.callbacks.ModelCheckpoint):
    """A time-triggered ModelCheckpoint that notes every save this process takes part in."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []

    def save(self, trainer, reason="manual"):
        self.seen.append([trainer.global_step, reason])
        super().save(trainer, reason=reason)


if jax.process_index() == 0:
    ktrainer.loop.run_clock.time = FastClock()
timed = SavesSeen(train_time_interval=60, max_to_keep=None)
trainer = kt.Trainer(max_epochs=2, batch_size=8, seed=0, default_root_dir=sys.argv[1] + "-clock",
                     enable_progress_bar=False, logger=False, callbacks=[timed])
trainer.fit(Net(), (x, y))
print("CLOCK", json.dumps({"process": jax.process_index(), "saves": timed.seen,
                           "last_model_path": timed.last_model_path}), flush=True)
