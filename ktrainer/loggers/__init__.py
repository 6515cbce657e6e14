"""Loggers: where metrics and hyperparameters go."""

from ktrainer.loggers.csv import CSVLogger
from ktrainer.loggers.logger import Logger
from ktrainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["Logger", "TensorBoardLogger", "CSVLogger"]
