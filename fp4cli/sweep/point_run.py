"""One sweep point trained into the store: the run it makes, tagged `point:<id>`, and its
result. The sweep's process and its workers both train points this way."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fp4cli.sweep.errors import SweepStopped
from fp4cli.sweep.points import BASELINE, Point

POINT_TAG = "point:"


@dataclass
class PointResult:
    point_id: str
    label: str
    task: str
    seed: int
    status: str  # finished, diverged, failed, interrupted
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""


def run_point(
    point: Point,
    sweep_id: str,
    tags: Sequence[str],
    device: str,
    store: Any,
    log_to: Sequence[str] = (),
) -> PointResult:
    """Train one point into `store` (streaming to the trackers of `log_to`); a failure is a
    result, not an exception."""
    from fp4cli.recipes import Recipe
    from fp4cli.train import run_training

    began = time.time()
    flags = {**point.train, "task": point.task, "recipe": point.recipe["name"]}
    flags |= {"seed": point.seed, "sweep": sweep_id, "tags": (*tags, POINT_TAG + point.id)}
    flags.setdefault("device", device)
    if log_to:
        flags["log_to"] = tuple(log_to)
    if point.label != BASELINE:  # a baseline is named by its recipe
        flags["name"] = point.label
    result = PointResult(point.id, point.label, point.task, point.seed, "failed")
    try:
        recipe = Recipe.from_dict(point.recipe, source=point.recipe.get("source", "sweep"))
        outcome, _ = run_training(flags, (), store, recipe=recipe)
    except SweepStopped:  # SIGTERM before the trainer took the signal: the sweep stops
        raise
    except Exception as error:  # the trainer has marked its run failed, if it made one
        result.message = " ".join(str(error).split())[:300] or type(error).__name__
    else:
        result.status, result.run_id = outcome.status, outcome.run_id
        result.metrics = outcome.metrics
    result.seconds = time.time() - began
    return result
