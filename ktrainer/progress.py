"""Progress: where a run stands. The one owner of "where are we": the loop, data, metrics and checkpoints read it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Progress", "RunningSums", "draw_seed"]


def draw_seed() -> int:
    """A fresh shuffle seed from the operating system's entropy (for `seed=None`)."""
    return int(np.random.SeedSequence().entropy % 2**31)


@dataclass
class RunningSums:
    """The running sums of one epoch (or one evaluation): per-name sums weighted by batch size.

    Attributes:
        sums: name -> sum over steps of (value x examples in the step).
        examples: Examples seen.
        steps: Steps seen.
    """

    sums: dict[str, float] = field(default_factory=dict)
    examples: float = 0.0
    steps: int = 0

    def add(self, values: dict[str, np.ndarray], sizes: np.ndarray) -> None:
        """Add the per-step `values` of several steps whose batch sizes are `sizes`."""
        sizes = [float(size) for size in sizes.tolist()]  # Python floats: a few steps' numpy calls cost more
        self.steps += len(sizes)
        self.examples += sum(sizes)
        for name, per_step in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + math.fsum(
                value * size for value, size in zip(per_step.tolist(), sizes, strict=True))

    def means(self) -> dict[str, float]:
        """name -> mean over the examples seen (empty before any example)."""
        if self.examples == 0:
            return {}
        return {name: total / self.examples for name, total in self.sums.items()}

    def state_dict(self) -> dict[str, Any]:
        """The sums as JSON values."""
        return {"sums": dict(self.sums), "examples": self.examples, "steps": self.steps}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> RunningSums:
        """The sums `state_dict` returned."""
        return cls({str(k): float(v) for k, v in state["sums"].items()}, float(state["examples"]), int(state["steps"]))


@dataclass
class Progress:
    """Where a run stands: what a checkpoint must hold for the run to continue exactly.

    The Trainer's loop moves it; the data source reads the shuffle seed and the position from it;
    the epoch's metric means come from its running sums; checkpoints save and restore it.

    Attributes:
        global_step: Optimizer steps taken (skipped ones included, as in Keras's `iterations`).
        epoch: The current epoch (0-based).
        batch_in_epoch: Training batches consumed in the current epoch.
        batches_trained: Training batches consumed in the whole run, every epoch (what an int
            `val_check_interval` counts when `check_val_every_n_epoch=None`).
        skipped_steps: Optimizer steps skipped for non-finite gradients (loss scaling).
        shuffle_seed: The base seed of the per-epoch shuffle of numpy data.
        epoch_sums: The current epoch's running metric sums.
        epoch_done: The current epoch's data is consumed and its end processed (validation, epoch
            metrics); `epoch` moves on once its `on_train_epoch_end` hooks ran.
        pending_validation: A validation inside the epoch is due here and has not finished (a
            checkpoint saved in the batch hooks before it, or a preemption during it): a resumed run
            runs it first.
    """

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    batches_trained: int = 0
    skipped_steps: int = 0
    shuffle_seed: int = 0
    epoch_sums: RunningSums = field(default_factory=RunningSums)
    epoch_done: bool = False
    pending_validation: bool = False

    def start_epoch(self) -> None:
        """Begin an epoch: fresh running sums unless it resumes part-way."""
        self.epoch_done = False
        if self.batch_in_epoch == 0:
            self.epoch_sums = RunningSums()

    def next_epoch(self) -> None:
        """Move to the next epoch once the current one's data is consumed and its hooks ran."""
        self.epoch += 1
        self.batch_in_epoch = 0
        self.epoch_done = False
        self.epoch_sums = RunningSums()

    def state_dict(self) -> dict[str, Any]:
        """The progress as JSON values. A consumed epoch is saved as the start of the next one."""
        if self.epoch_done:
            return {"global_step": self.global_step, "epoch": self.epoch + 1, "batch_in_epoch": 0,
                    "batches_trained": self.batches_trained, "skipped_steps": self.skipped_steps,
                    "shuffle_seed": self.shuffle_seed, "epoch_sums": None,
                    "pending_validation": False}
        sums = self.epoch_sums.state_dict() if self.batch_in_epoch else None
        return {"global_step": self.global_step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "batches_trained": self.batches_trained, "skipped_steps": self.skipped_steps,
                "shuffle_seed": self.shuffle_seed, "epoch_sums": sums,
                "pending_validation": self.pending_validation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what `state_dict` returned."""
        self.global_step = int(state["global_step"])
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
        # A checkpoint written before this count existed: count on from the epoch's position.
        self.batches_trained = int(state.get("batches_trained", self.batch_in_epoch))
        self.skipped_steps = int(state["skipped_steps"])
        self.shuffle_seed = int(state["shuffle_seed"])
        self.pending_validation = bool(state.get("pending_validation", False))
        sums = state.get("epoch_sums")
        self.epoch_sums = RunningSums.from_state_dict(sums) if sums else RunningSums()
        self.epoch_done = False
