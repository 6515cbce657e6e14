"""What a sharded checkpoint costs, against the same state gathered and saved whole by one process.

    python benchmarks/sharded_checkpoint.py [--width 4608] [--devices 8] [--processes 1] [--repeats 3]

A model of 4 square Dense layers (width x width float32 each) and Adam's two moments, trained one step
under strategy="fsdp" on `--devices` virtual CPU devices (JAX), so every variable is split `--devices`
ways; at the default width the state is about 1 GB. Each mode runs in a process of its own (so each
process's peak memory is its own):

- sharded: `trainer.save_checkpoint(path)` as ktrainer does it: each distinct slice read to the host and
  written, never the whole variable;
- gathered: the same save with every variable gathered whole first (what saving a sharded state with a
  tool that knows no slices does), in the same code path otherwise.

For each: the save's time and the bytes it wrote, the restore's time (read the files, check every
checksum, `load_state_dict` onto the same layout: a sharded checkpoint's slices are read by byte range,
one variable at a time, as they are placed), and the process's peak extra host memory during the
save and during the restore, beyond the state itself (on a CPU the devices' arrays live in host memory
too: this is what the save adds). Ratios compare the two modes measured on the same machine in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _measure(mode: str, width: int, devices: int, repeats: int, folder: str) -> dict:
    """One mode, in this process (JAX started here with `devices` virtual CPU devices; under `ktrainer launch`,
    one of several processes, each with `devices` of the mesh's)."""
    import jax
    import keras
    import numpy as np

    import ktrainer as kt
    from ktrainer.checkpoint import FsspecCheckpointIO
    from ktrainer.checkpoint.slices import ranged_files
    from ktrainer.checkpoint.snapshot import from_files
    from ktrainer.utils.fs import Location
    from ktrainer.utils.memory import process_peak, reset_process_peak

    class Big(kt.Module):
        """Four square Dense layers and Adam."""

        def build(self):
            return keras.Sequential([keras.layers.Input((width,))] +
                                    [keras.layers.Dense(width, use_bias=False) for _ in range(4)])

        def configure_optimizers(self):
            return keras.optimizers.Adam(1e-4)

        def training_step(self, batch):
            x, y = batch
            return keras.ops.mean(keras.ops.square(self.model(x) - y))

    x = np.zeros((16 * devices, width), np.float32)  # enough for one global batch of every process's devices
    trainer = kt.Trainer(strategy="fsdp", devices=devices, batch_size=1, max_steps=1, enable_progress_bar=False,
                         logger=False, enable_checkpointing=False, default_root_dir=folder)
    module = Big()
    trainer.fit(module, (x, x))
    processes = jax.process_count()
    state_bytes = sum(int(v.value.nbytes) for v in module.model.variables + trainer.optimizer.variables)
    saves, reads, peaks_save, peaks_restore, written = [], [], [], [], 0
    for number in range(repeats):
        name = f"ckpt-{number}"
        _in_step()
        reset_process_peak()
        baseline = process_peak()[0]
        start = time.perf_counter()
        if mode == "sharded":
            trainer.save_checkpoint(os.path.join(folder, name))  # every process its slices, the chief commits
        else:
            _gathered_save(trainer, Location(folder), name)
        _in_step()
        saves.append(time.perf_counter() - start)
        peaks_save.append(max(0, process_peak()[0] - baseline))
        written = sum(os.path.getsize(os.path.join(folder, name, file)) for file in os.listdir(os.path.join(folder,
                                                                                                           name)))
        reset_process_peak()
        baseline = process_peak()[0]
        start = time.perf_counter()
        info, files = FsspecCheckpointIO(Location(folder)).read(name)
        state, _ = from_files(files, ranged_files(info.manifest.fields))
        trainer.load_state_dict(state)
        _in_step()
        reads.append(time.perf_counter() - start)
        peaks_restore.append(max(0, process_peak()[0] - baseline))
        del files, state
    return {"mode": mode, "process": jax.process_index(), "processes": processes, "state_bytes": state_bytes,
            "written_bytes": written, "save_s": statistics.median(saves), "restore_s": statistics.median(reads),
            "save_peak_extra": max(peaks_save), "restore_peak_extra": max(peaks_restore),
            "shard_bytes": state_bytes // processes}


def _in_step() -> None:
    """Wait until every process got here (a time measured on one covers the work of all)."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("sharded_checkpoint")


def _gathered_save(trainer, location, name: str) -> None:
    """What a saver that knows no slices does: every variable gathered whole to the host (an all-process gather
    where the state spans processes), then the chief writes them all, through the same storage code."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from ktrainer.checkpoint import FsspecCheckpointIO
    from ktrainer.checkpoint.snapshot import to_files

    def gathered(value):
        if isinstance(value, dict):
            return {key: gathered(each) for key, each in value.items()}
        if isinstance(value, list | tuple):
            return [gathered(each) for each in value]
        array = getattr(value, "value", value)
        if isinstance(array, jax.Array):
            return np.asarray(multihost_utils.process_allgather(array, tiled=True))
        return value

    state = gathered(trainer.state_dict())
    if jax.process_index() == 0:
        save_id = f"{trainer.run.run_id}-{name.rsplit('-', 1)[-1]}"
        FsspecCheckpointIO(location).write(name, to_files(state, save_id), {"step": 1, "save_id": save_id,
                                                                          "run_id": trainer.run.run_id})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4608)
    parser.add_argument("--devices", type=int, default=8, help="devices in all (split evenly over the processes)")
    parser.add_argument("--processes", type=int, default=1, help="processes, started by `ktrainer launch`")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # one mode, in a child process
    parser.add_argument("--folder", help=argparse.SUPPRESS)  # where the children save (one for all of them)
    args = parser.parse_args()
    if args.mode:
        if args.processes == 1:
            import jax

            jax.config.update("jax_num_cpu_devices", args.devices)
        result = _measure(args.mode, args.width, args.devices // args.processes, args.repeats, args.folder)
        print("RESULT", json.dumps(result), flush=True)
        return
    results = {mode: _run(mode, args) for mode in ("sharded", "gathered")}
    sharded, gathered = results["sharded"][0], results["gathered"][0]
    print(f"{platform.machine()}, {os.cpu_count()} cores; state {sharded['state_bytes'] / 1e9:.2f} GB over "
          f"{args.devices} virtual CPU devices (fsdp) in {args.processes} process(es), each process's shards "
          f"{sharded['shard_bytes'] / 1e6:.0f} MB")
    print(f"{'mode':<10} {'process':>7} {'save s':>8} {'written GB':>11} {'restore s':>10} {'save peak extra MB':>19} "
          f"{'restore peak extra MB':>22}")
    for mode, reports in results.items():
        for each in reports:
            print(f"{mode:<10} {each['process']:>7} {each['save_s']:>8.2f} {each['written_bytes'] / 1e9:>11.2f} "
                  f"{each['restore_s']:>10.2f} {each['save_peak_extra'] / 1e6:>19.0f} "
                  f"{each['restore_peak_extra'] / 1e6:>22.0f}")
    print(f"gathered / sharded: save time {gathered['save_s'] / sharded['save_s']:.2f}x, restore time "
          f"{gathered['restore_s'] / sharded['restore_s']:.2f}x, save peak extra memory "
          f"{gathered['save_peak_extra'] / max(sharded['save_peak_extra'], 1):.2f}x")


def _run(mode: str, args: argparse.Namespace) -> list[dict]:
    """One mode in fresh processes (one, or `args.processes` under `ktrainer launch`): each one's report."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--width", str(args.width),
                   "--devices", str(args.devices), "--processes", str(args.processes), "--repeats",
                   str(args.repeats), "--folder", folder]
        if args.processes > 1:
            command = [sys.executable, "-m", "ktrainer.cli.main", "launch", "--nodes", str(args.processes), "--",
                       *command]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": "jax"},
                              cwd=folder)
        if done.returncode:
            sys.exit(f"{mode} failed:\n{done.stderr[-4000:]}")
    reports = [json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line]
    return sorted(reports, key=lambda report: report["process"])


if __name__ == "__main__":
    main()
