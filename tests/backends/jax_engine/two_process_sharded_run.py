"""One of two JAX processes, 4 virtual CPU devices each, training the transformer block sharded over all 8
(started by `ktrainer launch --nodes 2`, see test_two_process_sharding.py).

    python no_tensorflow.py two_process_sharded_run.py ROOT

Three fits, into ROOT/fsdp (mesh batch=8), ROOT/model_parallel (mesh batch=1 x model=8: each process holds
its own columns of each kernel) and ROOT/model_parallel_2x4 (batch=2 x model=4: each process one replica).
The fsdp run also saves ROOT/fsdp-final with `trainer.save_checkpoint` after its fit.
Each prints `RESULT {json}`: the strategy, this process's index, the step, the losses and the whole weights
(gathered from both processes, for the comparison only).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from jax.experimental import multihost_utils

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.backends...
from tests.backends.jax_engine.sharded_block import GLOBAL_BATCH, MODEL_LAYOUT, TransformerBlock, fit  # noqa: E402

RUNS = {"fsdp": (None, {"strategy": "fsdp", "batch_size": GLOBAL_BATCH // 8, "fsdp_min_bytes": 0}),
        "model_parallel": (MODEL_LAYOUT, {"strategy": "model_parallel", "mesh": {"batch": 1, "model": 8},
                                          "batch_size": GLOBAL_BATCH}),
        # Each process one row of the mesh: one data-parallel replica whose model is split over its 4 devices.
        "model_parallel_2x4": (MODEL_LAYOUT, {"strategy": "model_parallel", "mesh": {"batch": 2, "model": 4},
                                              "batch_size": GLOBAL_BATCH // 2})}
for strategy, (layout, arguments) in RUNS.items():
    module = TransformerBlock(layout)
    losses, trainer = fit(module, f"{sys.argv[1]}/{strategy}", steps=4, enable_checkpointing=True, devices=4,
                          **arguments)
    if strategy == "fsdp":  # a save outside fit: every process writes its slices, the chief commits
        trainer.save_checkpoint(f"{sys.argv[1]}/fsdp-final")
    weights = [np.asarray(multihost_utils.process_allgather(v.value, tiled=True)).tolist()
               for v in module.model.variables]
    print("RESULT", json.dumps({"strategy": strategy, "process": trainer.engine.process_index,
                                "step": trainer.global_step, "losses": losses, "weights": weights,
                                "last": trainer.checkpoint_callback.last_model_path}), flush=True)
