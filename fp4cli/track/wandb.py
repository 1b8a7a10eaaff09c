"""Weights & Biases: one W&B run per fp4cli run (the same id), the resolved config as its
config, the metrics and quantization statistics logged at their steps.

W&B runs offline (files under DIR/wandb, `wandb sync` uploads them) unless the user has
configured it: WANDB_MODE set, WANDB_API_KEY given, or a `wandb login` key in ~/.netrc leave
the choice to wandb. The project is
$WANDB_PROJECT, else `fp4cli`; a sweep's runs share their sweep id as the W&B group.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fp4cli.track.tensorboard import quant_tag

DEFAULT_PROJECT = "fp4cli"


def wandb_mode() -> str | None:
    """None (wandb decides) when the user configured W&B (WANDB_MODE, WANDB_API_KEY, or a
    `wandb login` in ~/.netrc), else offline."""
    configured = os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY")
    return None if configured or _logged_in() else "offline"


def _logged_in() -> bool:
    """Whether `wandb login` left a key for W&B's server in the netrc file."""
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return "api.wandb.ai" in netrc.read_text(errors="replace")
    except OSError:
        return False


class WandbTracker:
    def __init__(self, root: Path) -> None:
        from fp4cli.track.packages import missing_package

        try:
            import wandb
        except ImportError:
            raise missing_package("wandb", "wandb") from None
        self.wandb, self.root = wandb, Path(root)
        self.run: Any = None

    def start(self, run: Mapping[str, Any], step: int = 0) -> None:
        config = run["config"] if isinstance(run["config"], dict) else json.loads(run["config"])
        self.root.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            id=run["id"],
            name=run.get("name") or run["id"],
            group=run.get("sweep"),
            tags=list(run.get("tags") or [])[:64],
            config=config,
            dir=str(self.root),
            mode=wandb_mode(),
            resume="allow",
        )

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({name: float(value) for name, value in values.items()}, step=step)

    def quant_stats(self, step: int, rows: Iterable[tuple[str, str, str, float]]) -> None:
        values = {quant_tag(la, op, me): float(v) for la, op, me, v in rows}
        self.run.log(values, step=step)

    def finish(self, status: str) -> None:
        if self.run is not None:
            self.run.summary["status"] = status
            self.run.finish(exit_code=0 if status in ("finished", "diverged") else 1)
            self.run = None
