"""The trackers' optional packages: the one-line error when one is not installed."""

from __future__ import annotations

from fp4cli.train.config import ConfigError

INSTALL = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker -> extra of fp4cli


def missing_package(tracker: str, module: str) -> ConfigError:
    return ConfigError(
        f"log_to: {tracker} needs the {module} package, which is not installed: "
        f"pip install 'fp4cli[{INSTALL[tracker]}]'"
    )
