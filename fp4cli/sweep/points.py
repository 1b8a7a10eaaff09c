"""A sweep's points: the grid (or a random sample of it) less the excluded ones, times tasks and
seeds, plus the baseline recipes; each point a resolved recipe and training settings.

A point's id is a hash of what it trains (task, seed, training settings, the resolved recipe
without its name): the same run gets the same id however the file is reordered or relabelled,
so a resumed sweep recognizes what it finished, and two axes that make the same recipe make
one point.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fp4cli.sweep.errors import SweepError
from fp4cli.sweep.spec import BASE_KEY, MAX_POINTS, Axis, Setting, SweepSpec, is_train_key

ENUMERATE_LIMIT = 2_000_000  # larger grids are sampled without listing every point
BASELINE = "baseline"


@dataclass(frozen=True)
class Point:
    id: str
    task: str
    seed: int
    label: str  # "scale=ue5m3,rounding=sr", or "baseline" for a baseline recipe
    recipe: dict[str, Any] = field(hash=False)  # Recipe.to_dict(), named for the point
    train: dict[str, Any] = field(hash=False)  # TrainConfig fields (the file's + the axes')
    choices: dict[str, str] = field(hash=False)  # axis name -> value label


def expand_points(spec: SweepSpec) -> list[Point]:
    """Every point of the sweep, baselines first for each task and seed; duplicates dropped."""
    from fp4cli.recipes import load_recipe

    _check_tasks(spec)
    combos = [dict(zip([a.name for a in spec.axes], c, strict=True)) for c in _combos(spec)]
    built = [_build(spec, load_recipe(spec.base), combo) for combo in combos]
    baselines = [_baseline(spec, ref) for ref in spec.baselines]
    points: dict[str, Point] = {}
    for task, seed in itertools.product(spec.tasks, spec.seeds):
        for label, recipe, train, choices in [*baselines, *built]:
            point = _point(task, seed, label, recipe, train, choices)
            points.setdefault(point.id, point)
    return list(points.values())


def _check_tasks(spec: SweepSpec) -> None:
    from fp4cli.tasks.base import task_names

    known = task_names()
    for task in spec.tasks:
        if task not in known:
            raise SweepError(
                f"{spec.source}: tasks: unknown task {task!r}; known: {', '.join(known)}"
            )


def point_label(choices: dict[str, str]) -> str:
    return ",".join(f"{name}={value}" for name, value in choices.items()) or "base"


def _combos(spec: SweepSpec) -> list[tuple[str, ...]]:
    """Label tuples: the whole grid less exclusions, or a seeded sample of it."""
    if spec.sample is None:
        if spec.grid_size > MAX_POINTS:
            raise SweepError(
                f"{spec.source}: the grid has {spec.grid_size:,} points, more than a sweep "
                f"trains ({MAX_POINTS:,}); add `sample: N` to draw N of them"
            )
        return [c for c in _grid(spec.axes) if not _excluded(spec, c)]
    rng = random.Random(spec.sample_seed)
    if spec.grid_size <= ENUMERATE_LIMIT:
        allowed = [c for c in _grid(spec.axes) if not _excluded(spec, c)]
        return rng.sample(allowed, min(spec.sample, len(allowed)))
    chosen: dict[tuple[str, ...], None] = {}
    for _ in range(spec.sample * 100):  # rejection sampling over a grid too large to list
        combo = tuple(rng.choice(axis.labels) for axis in spec.axes)
        if not _excluded(spec, combo):
            chosen.setdefault(combo)
            if len(chosen) == spec.sample:
                break
    return list(chosen)


def _grid(axes: Sequence[Axis]) -> Iterator[tuple[str, ...]]:
    return itertools.product(*(axis.labels for axis in axes))


def _excluded(spec: SweepSpec, combo: tuple[str, ...]) -> bool:
    chosen = dict(zip([a.name for a in spec.axes], combo, strict=True))
    return any(
        all(chosen[name] in labels for name, labels in rule.items()) for rule in spec.exclude
    )


def _settings(spec: SweepSpec, choices: dict[str, str]) -> list[Setting]:
    settings: list[Setting] = []
    for axis in spec.axes:
        settings += axis.settings[axis.labels.index(choices[axis.name])]
    return settings


def _build(
    spec: SweepSpec, base: Any, choices: dict[str, str]
) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, str]]:
    from fp4cli.recipes import RecipeError, apply_values

    settings = _settings(spec, choices)
    recipe_values = [(k, v) for k, v in settings if not is_train_key(k) and k != BASE_KEY]
    train = dict(spec.train) | {k: v for k, v in settings if is_train_key(k)}
    label = point_label(choices)
    try:
        base = _point_base(base, settings)
        recipe = apply_values(base, recipe_values, f"{spec.source} ({label})")
    except RecipeError as error:
        raise SweepError(f"{error}; leave the point out with an `exclude:` rule") from None
    _check_train(spec, train, label)
    name = base.name if not spec.axes else f"{base.name}[{label}]"
    return label, recipe.to_dict() | {"name": name}, train, choices


def _point_base(base: Any, settings: list[Setting]) -> Any:
    """The recipe a point starts from: an axis's `base` value, else the file's."""
    from fp4cli.recipes import load_recipe

    named = [value for key, value in settings if key == BASE_KEY]
    return load_recipe(str(named[-1])) if named else base


def _baseline(
    spec: SweepSpec, ref: str
) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, str]]:
    from fp4cli.recipes import RecipeError, load_recipe

    try:
        recipe = load_recipe(ref)
    except RecipeError as error:
        raise SweepError(f"{spec.source}: baselines: {error}") from None
    return BASELINE, recipe.to_dict(), dict(spec.train), {}


def _check_train(spec: SweepSpec, train: dict[str, Any], label: str) -> None:
    from fp4cli.train.config import ConfigError, TrainConfig

    try:
        TrainConfig(**train)
    except ConfigError as error:
        raise SweepError(f"{spec.source} ({label}): {error}") from None


def _point(
    task: str,
    seed: int,
    label: str,
    recipe: dict[str, Any],
    train: dict[str, Any],
    choices: dict[str, str],
) -> Point:
    about = ("name", "source", "description", "citation")  # what a recipe says, not trains
    trained = {k: v for k, v in recipe.items() if k not in about}
    identity = {"task": task, "seed": seed, "train": train, "recipe": trained}
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode())
    return Point(digest.hexdigest()[:12], task, seed, label, recipe, train, choices)
