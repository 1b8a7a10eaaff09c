"""TrackedStore: the run store, with every metric and statistic it accepts also sent to the
run's trackers (rank 0 of a run only: the other ranks write nothing)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def tracked(store: Any, names: Sequence[str], folder: Path | None = None) -> Any:
    """`store` itself when no tracker is asked for, else a TrackedStore. The trackers' files go
    to `folder` (default: beside the store file); a missing package is a ConfigError now,
    before any training."""
    if not names:
        return store
    root = folder if folder is not None else Path(store.path).resolve().parent
    return TrackedStore(store, [_make(name, root) for name in names])


def _make(name: str, root: Path) -> Any:
    if name == "tensorboard":
        from fp4cli.track.tensorboard import TensorBoardTracker

        return TensorBoardTracker(root / "tensorboard")
    from fp4cli.track.wandb import WandbTracker

    return WandbTracker(root)


class TrackedStore:
    """Forwards everything to the store; what a run logs also goes to each tracker."""

    def __init__(self, store: Any, trackers: list[Any]) -> None:
        self.store, self.trackers = store, trackers

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def create_run(self, *args: Any, **kwargs: Any) -> str:
        run_id = self.store.create_run(*args, **kwargs)
        self._start(run_id, 0)
        return str(run_id)

    def reopen_run(self, run_id: str, step: int) -> None:
        self.store.reopen_run(run_id, step)
        self._start(run_id, step)

    def _start(self, run_id: str, step: int) -> None:
        run = self.store.get_run(run_id)
        for tracker in self.trackers:
            tracker.start(run, step)

    def log_metrics(self, run_id: str, step: int, values: Mapping[str, float]) -> None:
        self.store.log_metrics(run_id, step, values)
        for tracker in self.trackers:
            tracker.metrics(step, values)

    def log_quant_stats(
        self, run_id: str, step: int, rows: Iterable[tuple[str, str, str, float]]
    ) -> None:
        rows = list(rows)
        self.store.log_quant_stats(run_id, step, rows)
        for tracker in self.trackers:
            tracker.quant_stats(step, rows)

    def finish_run(self, run_id: str, status: str, *args: Any, **kwargs: Any) -> None:
        self.store.finish_run(run_id, status, *args, **kwargs)
        for tracker in self.trackers:
            tracker.finish(status)
