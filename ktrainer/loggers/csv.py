"""Metrics as a CSV file (and hyperparameters as JSON), on any fsspec filesystem."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from ktrainer.loggers.logger import Logger

__all__ = ["CSVLogger"]


class CSVLogger(Logger):
    """Writes `metrics.csv` (one row per logged step, a column per metric) and `hparams.json`.

    The whole file is rewritten at each flush, so a metric that appears later (e.g. a
    validation metric) becomes a column of every row, and the file on an object store is
    always complete. A run resumed from a checkpoint keeps the rows its folder holds up to the
    checkpoint's step and appends its own.

    Args:
        save_dir: Root directory; None: the Trainer's `default_root_dir`.
        name: Sub-directory under `save_dir`.
        version: Version number or folder name; None picks the next free one.
        storage_options: Passed to the fsspec filesystem.
    """

    METRICS_FILE = "metrics.csv"
    HPARAMS_FILE = "hparams.json"

    def __init__(self, save_dir: str | None = None, name: str = "csv", version: int | str | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(save_dir, name, version, storage_options)
        self._rows: list[dict[str, Any]] = []
        self._dirty = False

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Add a row for `step` (merged with the previous row when it is the same step)."""
        if not self.writes:
            return
        if self._rows and self._rows[-1]["step"] == step:
            self._rows[-1].update(metrics)
        else:
            self._rows.append({"step": step, **metrics})
        self._dirty = True

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Write `hparams.json`."""
        if not self.writes:
            return
        text = json.dumps(params, indent=2, sort_keys=True, default=str)
        self.location.write_bytes(self.HPARAMS_FILE, text.encode())

    def state_dict(self) -> dict[str, Any]:
        """The version, and the last step logged: a resumed run keeps the file's rows up to it."""
        return {**super().state_dict(), "step": self._rows[-1]["step"] if self._rows else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the saved version (see `Logger.load_state_dict`) and, in its folder, the rows logged up to the
        checkpoint (later ones, from a run stopped after it, are logged again)."""
        super().load_state_dict(state)
        if self._version == state.get("version") and not self._rows:
            last = state.get("step", math.inf)  # a checkpoint without it: keep every row
            self._rows = [row for row in self._saved_rows() if last is not None and row["step"] <= last]

    def _saved_rows(self) -> list[dict[str, Any]]:
        if not self.location.join(self.METRICS_FILE).exists():
            return []
        text = self.location.read_bytes(self.METRICS_FILE).decode()
        # Values stay the text they were written as; an empty cell is a metric not logged at that step.
        return [{"step": int(row["step"]), **{k: v for k, v in row.items() if k != "step" and v != ""}}
                for row in csv.DictReader(io.StringIO(text))]

    def flush(self) -> None:
        """Rewrite `metrics.csv` with every row so far."""
        if not self._dirty:
            return
        columns = ["step"] + sorted({k for row in self._rows for k in row} - {"step"})
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self._rows)
        self.location.write_bytes(self.METRICS_FILE, buffer.getvalue().encode())
        self._dirty = False
