"""One of two JAX processes started by `ktrainer launch --nodes 2` (see test_two_processes.py).

    python no_tensorflow.py two_process_run.py ROOT

Prints `RESULT {json}`: its process index, replicas, step, whether it is the chief, its weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

import ktrainer as kt

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.backends.leg_run
from tests.backends.leg_run import Net, data  # noqa: E402

# No num_nodes: the launcher's variables say this process is one of two, as TF_CONFIG does on TensorFlow.
trainer = kt.Trainer(max_epochs=2, batch_size=8, seed=0, default_root_dir=sys.argv[1],
                     enable_progress_bar=False, logger=True)
module = Net()
x, y = data()
trainer.fit(module, (x, y))
print("RESULT", json.dumps({"process": jax.process_index(), "replicas": trainer.num_replicas,
                            "step": trainer.global_step, "chief": trainer.is_global_zero,
                            "last_model_path": trainer.checkpoint_callback.last_model_path,
                            "weights": [np.asarray(w).tolist() for w in module.model.get_weights()],
                            "tensorflow_imported": "tensorflow" in sys.modules}), flush=True)
