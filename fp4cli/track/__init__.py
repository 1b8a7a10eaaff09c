"""Trackers: the metrics and quantization statistics a run writes to the store, streamed as well
to TensorBoard and/or Weights & Biases (`--log-to tensorboard,wandb`, the TrainConfig field
`log_to`, a sweep's `log_to:`), with the run's resolved config as its hyperparameters.

The store stays the source of truth: a tracker only receives what the store has just accepted,
and `fp4 runs export RUN --tensorboard DIR` writes the same event files afterwards. Neither
tracker is needed to install or use fp4cli: each is an optional extra, imported only when a run
asks for it (a one-line error says how to install a missing one).
"""

from fp4cli.track.store import TrackedStore, tracked
from fp4cli.train.config import TRACKERS, parse_log_to

__all__ = ["TRACKERS", "TrackedStore", "parse_log_to", "tracked"]
