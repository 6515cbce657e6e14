"""What a sharded checkpoint costs, against the same state gathered and saved whole by one process.

    python benchmarks/sharded_checkpoint.py [--width 4608] [--devices 8] [--repeats 3]

A model of 4 square Dense layers (width x width float32 each) and Adam's two moments, trained one step
under strategy="fsdp" on `--devices` virtual CPU devices (JAX), so every variable is split `--devices`
ways; at the default width the state is about 1 GB. Each mode runs in a process of its own (so each
process's peak memory is its own):

- sharded: `trainer.save_checkpoint(path)` as ktrainer does it: each distinct slice read to the host and
  written, never the whole variable;
- gathered: the same save with every variable gathered whole first (what saving a sharded state with a
  tool that knows no slices does), in the same code path otherwise.

For each: the save's time and the bytes it wrote, the restore's time (read every file, check every
checksum, `load_state_dict` onto the same layout), and the process's peak extra host memory during the
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
    """One mode, in this process (JAX started here with `devices` virtual CPU devices)."""
    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    import keras
    import numpy as np

    import ktrainer as kt
    import ktrainer.checkpoint.snapshot as snapshot
    from ktrainer.checkpoint import FsspecCheckpointIO
    from ktrainer.checkpoint.snapshot import from_files
    from ktrainer.utils.fs import Location
    from ktrainer.utils.memory import process_peak, reset_process_peak

    if mode == "gathered":
        snapshot.sliced_of = lambda value: None  # every variable written whole: gathered to the host first

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

    x = np.zeros((devices, width), np.float32)
    trainer = kt.Trainer(strategy="fsdp", devices=devices, batch_size=1, max_steps=1, enable_progress_bar=False,
                         logger=False, enable_checkpointing=False, default_root_dir=folder)
    module = Big()
    trainer.fit(module, (x, x))
    state_bytes = sum(int(v.value.nbytes) for v in module.model.variables + trainer.optimizer.variables)
    saves, reads, peaks_save, peaks_restore, written = [], [], [], [], 0
    for number in range(repeats):
        path = os.path.join(folder, f"ckpt-{number}")
        reset_process_peak()
        baseline = process_peak()[0]
        start = time.perf_counter()
        trainer.save_checkpoint(path)
        saves.append(time.perf_counter() - start)
        peaks_save.append(max(0, process_peak()[0] - baseline))
        written = sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))
        reset_process_peak()
        baseline = process_peak()[0]
        start = time.perf_counter()
        store = FsspecCheckpointIO(Location(folder), verify_checksums=True)
        _, files = store.read(f"ckpt-{number}")
        state, _ = from_files(files)
        trainer.load_state_dict(state)
        reads.append(time.perf_counter() - start)
        peaks_restore.append(max(0, process_peak()[0] - baseline))
        del files, state
    return {"mode": mode, "state_bytes": state_bytes, "written_bytes": written, "save_s": statistics.median(saves),
            "restore_s": statistics.median(reads), "save_peak_extra": max(peaks_save),
            "restore_peak_extra": max(peaks_restore), "slice_bytes": state_bytes // devices}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4608)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # one mode, in a child process
    args = parser.parse_args()
    if args.mode:
        with tempfile.TemporaryDirectory() as folder:
            print("RESULT", json.dumps(_measure(args.mode, args.width, args.devices, args.repeats, folder)))
        return
    results = {}
    for mode in ("sharded", "gathered"):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", mode, "--width", str(args.width),
                               "--devices", str(args.devices), "--repeats", str(args.repeats)],
                              capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": "jax"}, check=True)
        results[mode] = json.loads(done.stdout.split("RESULT ", 1)[1])
    sharded, gathered = results["sharded"], results["gathered"]
    print(f"{platform.machine()}, {os.cpu_count()} cores; state {sharded['state_bytes'] / 1e9:.2f} GB over "
          f"{args.devices} virtual CPU devices (fsdp), each device's slice {sharded['slice_bytes'] / 1e6:.0f} MB")
    print(f"{'mode':<10} {'save s':>8} {'written GB':>11} {'restore s':>10} {'save peak extra MB':>19} "
          f"{'restore peak extra MB':>22}")
    for mode, each in results.items():
        print(f"{mode:<10} {each['save_s']:>8.2f} {each['written_bytes'] / 1e9:>11.2f} {each['restore_s']:>10.2f} "
              f"{each['save_peak_extra'] / 1e6:>19.0f} {each['restore_peak_extra'] / 1e6:>22.0f}")
    print(f"gathered / sharded: save time {gathered['save_s'] / sharded['save_s']:.2f}x, restore time "
          f"{gathered['restore_s'] / sharded['restore_s']:.2f}x, save peak extra memory "
          f"{gathered['save_peak_extra'] / max(sharded['save_peak_extra'], 1):.2f}x")


if __name__ == "__main__":
    main()
