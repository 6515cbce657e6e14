"""One of two JAX processes training the transformer block under "fsdp" over both (4 virtual CPU devices each),
saving to S3, where process 1 is killed (SIGKILL) in its second save, just after it wrote its slices and before
the chief could commit (see test_two_process_sharding.py).

    python no_tensorflow.py two_process_killed_save.py ROOT STORAGE_OPTIONS_JSON

Process 1 prints `KILLED AFTER {json}` (the files it wrote) before it kills itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from ktrainer.checkpoint.fsspec_io import FsspecCheckpointIO

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.backends...
from tests.backends.jax_engine.sharded_block import GLOBAL_BATCH, TransformerBlock, fit  # noqa: E402

written_parts: list[list[str]] = []
_write_part = FsspecCheckpointIO.write_part


def _killed_in_the_second_save(self, name, files):
    entries = _write_part(self, name, files)
    written_parts.append([entry.name for entry in entries])
    if len(written_parts) == 2:
        print("KILLED AFTER", json.dumps({"checkpoint": name, "files": written_parts[-1]}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return entries


if os.environ["KERAS_DISTRIBUTION_PROCESS_ID"] == "1":  # not jax.process_index(): JAX must not start yet
    FsspecCheckpointIO.write_part = _killed_in_the_second_save
fit(TransformerBlock(), sys.argv[1], steps=4, enable_checkpointing=True, storage_options=json.loads(sys.argv[2]),
    strategy="fsdp", devices=4, batch_size=GLOBAL_BATCH // 8, fsdp_min_bytes=0)
