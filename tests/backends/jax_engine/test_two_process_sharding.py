"""Two JAX processes of 4 virtual CPU devices each (`ktrainer launch`, jax.distributed on 127.0.0.1) train the
transformer block sharded over all 8: the losses and weights of a one-process run on 8 devices, each process
writing only the slices its own devices own (nothing twice), the chief committing one manifest of everyone's
files, and the checkpoint resuming exactly in one process on another mesh and on one device.

Runs in the JAX session (8 virtual CPU devices in this process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ktrainer.checkpoint.slices import SLICED
from ktrainer.checkpoint.tensors import read_tensors
from tests.backends.jax_engine.sharded_block import GLOBAL_BATCH, MODEL_LAYOUT, TransformerBlock, fit

pytestmark = pytest.mark.jax_only

HERE = Path(__file__).parent
ONE_PROCESS = {"fsdp": (None, {"strategy": "fsdp", "devices": 8, "batch_size": GLOBAL_BATCH // 8,
                               "fsdp_min_bytes": 0}),
               "model_parallel": (MODEL_LAYOUT, {"strategy": "model_parallel", "mesh": {"batch": 1, "model": 8},
                                                 "batch_size": GLOBAL_BATCH}),
               "model_parallel_2x4": (MODEL_LAYOUT, {"strategy": "model_parallel", "mesh": {"batch": 2, "model": 4},
                                                     "batch_size": GLOBAL_BATCH // 2})}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    """Both strategies' runs in the two launched processes: each one's report, by strategy, process 0 first."""
    root = tmp_path_factory.mktemp("two")
    command = [sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", "2", "--", sys.executable,
               str(HERE / "no_tensorflow.py"), str(HERE / "two_process_sharded_run.py"), str(root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(HERE.parents[2])})
    assert done.returncode == 0, done.stderr[-4000:]
    reports: dict[str, list[dict]] = {}
    for line in done.stdout.splitlines():
        if "RESULT " in line:
            report = json.loads(line.split("RESULT ", 1)[1])
            reports.setdefault(report["strategy"], []).append(report)
    return root, {name: sorted(each, key=lambda r: r["process"]) for name, each in reports.items()}


@pytest.mark.parametrize("strategy", list(ONE_PROCESS))
def test_two_processes_train_the_losses_and_weights_of_one_process_on_eight_devices(two_processes, strategy,
                                                                                   tmp_path):
    _, reports = two_processes
    layout, arguments = ONE_PROCESS[strategy]
    module = TransformerBlock(layout)
    losses, _ = fit(module, tmp_path, **arguments)
    assert [r["process"] for r in reports[strategy]] == [0, 1]
    for report in reports[strategy]:
        assert report["step"] == 4
        np.testing.assert_allclose(report["losses"], losses, atol=1e-5, rtol=0)
        for theirs, mine in zip(report["weights"], module.model.variables, strict=True):
            # The collectives between processes sum in another order than within one: last bits differ.
            np.testing.assert_allclose(theirs, np.asarray(mine.value), atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", ["fsdp", "model_parallel"])  # on 2 x 4, process 0's devices hold every slice
def test_each_process_writes_only_the_slices_its_devices_own_and_the_chief_commits_them_all(two_processes, strategy):
    root, _ = two_processes
    checkpoint = root / strategy / "checkpoints" / "step-00000004"
    written = {process: {} for process in (0, 1)}  # process -> tensor key -> its shape
    for path in checkpoint.glob("*.tensors"):
        process = 1 if "-p00001." in path.name else 0
        written[process].update({k: v.shape for k, v in read_tensors(path.read_bytes()).items()})
    state = json.loads(next(checkpoint.glob("trainer.*.json")).read_text())
    sliced = [value[SLICED] for section in ("model", "optimizer") for value in state[section].values()
              if SLICED in value]
    keys = [key for each in sliced for _, key, _ in each["parts"]]
    assert written[1] and set(written[1]) <= set(keys)  # process 1 wrote slices, and only slices
    assert not set(written[0]) & set(written[1])  # nothing was written twice
    assert set(keys) <= set(written[0]) | set(written[1])  # every slice was written by someone
    # Process 1's devices are the mesh's last four: it wrote exactly the slices in the second half of the split
    # dimension, each with the shape of its region.
    for each in sliced:
        for _, key, region in each["parts"]:
            (start, size), = [(a, full) for (a, b), full in zip(region, each["shape"], strict=True) if b - a < full]
            assert (key in written[1]) == (start >= size // 2), (key, region)
            assert written[1 if key in written[1] else 0][key] == tuple(b - a for a, b in region)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert {e["name"] for e in manifest["files"]} == {p.name for p in checkpoint.iterdir()} - {"manifest.json"}
    from_process_1 = {tensor.partition("/")[2] for file, entries in manifest["slices"].items() if "-p00001." in file
                      for tensor, *_ in entries}
    assert from_process_1 == {key.lstrip("/") for key in written[1]}  # the manifest knows who wrote which slice


@pytest.mark.parametrize("target", ["(2, 4)", "one device"])
def test_a_checkpoint_of_two_processes_resumes_exactly_in_one(two_processes, target, tmp_path):
    root, reports = two_processes
    arguments = ({"strategy": "model_parallel", "mesh": {"batch": 2, "model": 4}, "batch_size": GLOBAL_BATCH // 2}
                 if target == "(2, 4)" else {"devices": 1, "batch_size": GLOBAL_BATCH})
    module = TransformerBlock(MODEL_LAYOUT if target == "(2, 4)" else None)
    checkpoint = root / "fsdp" / "checkpoints" / "step-00000002"
    _, trainer = fit(module, tmp_path, steps=4, ckpt_path=str(checkpoint), enable_checkpointing=True, **arguments)
    assert trainer.global_step == 4
    for theirs, mine in zip(reports["fsdp"][0]["weights"], module.model.variables, strict=True):
        np.testing.assert_allclose(np.asarray(mine.value), theirs, atol=1e-6, rtol=0)


def test_save_checkpoint_after_a_two_process_fit_writes_every_process_slices_and_resumes_exactly(two_processes,
                                                                                                  tmp_path):
    root, reports = two_processes
    checkpoint = root / "fsdp-final"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert any("-p00001." in file for file in manifest["slices"])  # process 1 wrote its own slices of it
    module = TransformerBlock()
    _, trainer = fit(module, tmp_path, steps=4, ckpt_path=str(checkpoint), devices=1, batch_size=GLOBAL_BATCH,
                     enable_checkpointing=True)
    assert trainer.global_step == 4  # resumed at the end: nothing left to train
    for theirs, mine in zip(reports["fsdp"][0]["weights"], module.model.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(mine.value), np.asarray(theirs, np.float32))


def test_a_process_killed_during_a_sharded_save_to_s3_leaves_last_on_the_previous_checkpoint(s3_bucket, tmp_path):
    """kill -9 of process 1 after it wrote its slices of step 4 and before the chief committed: no manifest of step 4
    exists, "last" is step 2, and resuming from it (in one process) ends where a run that never stopped ends."""
    import s3fs

    root, options = s3_bucket
    command = [sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", "2", "--", sys.executable,
               str(HERE / "no_tensorflow.py"), str(HERE / "two_process_killed_save.py"), f"{root}/run",
               json.dumps(options)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(HERE.parents[2])})
    assert done.returncode != 0, done.stdout[-2000:]
    assert "KILLED AFTER " in done.stdout, done.stderr[-4000:]
    (killed,) = [json.loads(line.split("KILLED AFTER ", 1)[1]) for line in done.stdout.splitlines()
                 if "KILLED AFTER " in line]
    assert killed["checkpoint"] == "step-00000004" and killed["files"]
    fs = s3fs.S3FileSystem(**options)
    step4 = [path.rpartition("/")[2] for path in fs.ls(f"{root}/run/checkpoints/step-00000004", refresh=True)]
    assert set(killed["files"]) <= set(step4) and "manifest.json" not in step4  # written, never committed
    straight = TransformerBlock()
    fit(straight, tmp_path / "straight", strategy="fsdp", devices=8, batch_size=GLOBAL_BATCH // 8, fsdp_min_bytes=0)
    module = TransformerBlock()
    with pytest.warns(UserWarning, match=r"step-00000004 is not valid \(no manifest \(an interrupted save\)\)"):
        _, trainer = fit(module, f"{root}/run", steps=4, ckpt_path="last", storage_options=options,
                         enable_checkpointing=True, strategy="fsdp", devices=8, batch_size=GLOBAL_BATCH // 8,
                         fsdp_min_bytes=0)
    assert trainer.global_step == 4
    assert trainer.run.parent.endswith("/step-00000002")  # "last" was the previous checkpoint
    for resumed, stayed in zip(module.model.variables, straight.model.variables, strict=True):
        np.testing.assert_allclose(np.asarray(resumed.value), np.asarray(stayed.value), atol=1e-6, rtol=0)
