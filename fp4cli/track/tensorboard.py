"""TensorBoard event files of a run: DIR/<run id>/events.out.tfevents.*, written with
torch.utils.tensorboard (which needs the `tensorboard` package, fp4cli's `tensorboard` extra).

Tags: each metric under its own name (train_loss, val_loss, lr, ...), each quantization
statistic as quant/<layer>/<operand>/<metric>; the resolved config as the run's hyperparameters
(the HPARAMS tab: one flat key per field, e.g. train.lr, recipe.linear.forward.x.scale) and as
YAML text (tag `config`). A resumed run purges the events after its checkpoint's step, as the
store drops its rows, so the curves show one value per step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

EVENT_PREFIX = "events.out.tfevents."


def quant_tag(layer: str, operand: str, metric: str) -> str:
    return f"quant/{layer}/{operand}/{metric}"


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted.key: int | float | str | bool} (lists and null as text)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat |= flat_config(value, name + ".")
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, sort_keys=True, default=str)
    return flat


class TensorBoardTracker:
    """Streams one run at a time into `root`/<run id>."""

    def __init__(self, root: Path) -> None:
        from fp4cli.track.packages import missing_package

        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise missing_package("tensorboard", "tensorboard") from None
        self.root, self.writer_class = Path(root), SummaryWriter
        self.writer: Any = None

    def folder(self, run_id: str) -> Path:
        return self.root / run_id

    def start(self, run: Mapping[str, Any], step: int = 0) -> None:
        """Open the run's event file; a run resumed at `step` hides the events an earlier
        attempt wrote after it."""
        import yaml
        from torch.utils.tensorboard.summary import hparams

        purge = step + 1 if step > 0 else None  # the store keeps the rows up to `step`
        self.writer = self.writer_class(log_dir=str(self.folder(run["id"])), purge_step=purge)
        config = run["config"] if isinstance(run["config"], dict) else json.loads(run["config"])
        for summary in hparams(flat_config(config), {}):
            self.writer.file_writer.add_summary(summary)
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "```\n" + text + "```", global_step=step)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, float(value), global_step=step)

    def quant_stats(self, step: int, rows: Iterable[tuple[str, str, str, float]]) -> None:
        for layer, operand, metric, value in rows:
            self.writer.add_scalar(quant_tag(layer, operand, metric), float(value), step)

    def finish(self, status: str) -> None:
        if self.writer is not None:
            self.writer.add_text("status", status)
            self.writer.close()
            self.writer = None


def export_runs(store: Any, run_ids: Iterable[str], root: Path) -> list[Path]:
    """Write the event files of runs already in `store` into `root`/<run id> (replacing event
    files an earlier export wrote there); returns the folders."""
    tracker = TensorBoardTracker(root)
    folders = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        folder = tracker.folder(run["id"])
        for old in folder.glob(EVENT_PREFIX + "*") if folder.is_dir() else []:
            old.unlink()
        tracker.start(run)
        by_step: dict[int, dict[str, float]] = {}
        for row in store.metrics(run["id"]):
            by_step.setdefault(row["step"], {})[row["name"]] = row["value"]
        for step in sorted(by_step):
            tracker.metrics(step, by_step[step])
        for row in store.quant_stats(run["id"]):
            rows = [(row["layer"], row["operand"], row["metric"], row["value"])]
            tracker.quant_stats(row["step"], rows)
        tracker.finish(run["status"])
        folders.append(folder)
    return folders
