"""Training: one trainer for every task, the run's config resolution, checkpoints, statistics."""

from fp4cli.train.api import run_training
from fp4cli.train.config import ConfigError, TrainConfig
from fp4cli.train.loop import RunResult, Trainer

__all__ = ["ConfigError", "RunResult", "TrainConfig", "Trainer", "run_training"]
