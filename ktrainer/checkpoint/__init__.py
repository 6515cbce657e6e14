"""Checkpoints: what one holds (state.py), how it is written, verified, listed and pruned (manager.py)."""

from ktrainer.checkpoint.manager import CheckpointError, CheckpointInfo, CheckpointManager
from ktrainer.checkpoint.state import TrainingState

__all__ = ["CheckpointManager", "CheckpointInfo", "CheckpointError", "TrainingState"]
