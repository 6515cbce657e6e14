"""ktrainer's version: one place, read by the package face and by what a checkpoint records."""

__version__ = "0.1.0"
