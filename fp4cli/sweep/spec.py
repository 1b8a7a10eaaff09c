"""The sweep file: a base recipe, tasks, seeds, training settings, and axes over any field.

    name: design-space            # the sweep's name in the store (default: the file's stem)
    base: mxfp4                   # the recipe every point starts from (a name or a path)
    tasks: [regression]
    seeds: [0]
    train: {size: default, steps: 500}          # TrainConfig fields shared by every run
    baselines: [bf16, mxfp4]      # recipes run once per task x seed (the report's references)
    baseline: tseng-baseline      # optional: the recipe whose gap `fp4 report`'s closed share
                                  # divides (default mxfp4); added to `baselines`
    axes:
      linear.grad_weight.hadamard: [null, 32]   # a dotted key: its values
      bwd_rounding:                             # a name: keys set together to each value
        set: linear.grad_*.*.rounding
        values: [rne, sr]
      scale:                                    # a name: labelled sets of (key: value)
        e8m0: {}
        ue5m3: {linear.*.*.scale: ue5m3, linear.*.*.tensor_scale: true}
    sample: 50                    # optional: a random sample of 50 grid points (sample_seed: 0)
    exclude:                      # optional: points matching every entry of a rule are left out
      - {scale: ue5m3, bwd_rounding: sr}
    log_to: [tensorboard]         # optional: trackers every run streams to (not part of a point)
    slurm: {partition: gpu, time_min: 60}   # optional: cluster options (launchers.py)

A key is a recipe key (dotted, `*` components match every quantized operand: see
fp4cli.recipes.apply_values), a training field (`lr`, `steps`, ...) or `base`: the recipe the
point starts from, before the other keys apply (an axis over methods:
`method: {set: base, values: [tetrajet, nvfp4]}`). Values are YAML; an
axis value's label is its YAML text (`null`, `32`, `sr`), and exclusion rules name labels.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fp4cli.recipe_loader import names_a_file, read_yaml_file
from fp4cli.recipe_schema import did_you_mean
from fp4cli.sweep.errors import SweepError
from fp4cli.sweep.launchers import ClusterOptions, parse_cluster
from fp4cli.train.config import SEED_MAX, ConfigError, TrainConfig

MAX_POINTS = 10_000  # runs one sweep may train (a larger grid is sampled)
SWEEP_KEYS = (
    "name", "description", "base", "tasks", "seeds", "train", "baselines", "baseline", "axes",
    "sample", "sample_seed", "exclude", "tags", "log_to", "slurm",
)  # fmt: skip
# Training fields a sweep sets for every run itself, never from the file (log_to: a top-level
# key, since trackers do not change what a point trains).
RESERVED_TRAIN = ("task", "recipe", "seed", "tags", "sweep", "log_to")
TRAIN_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrainConfig) if f.name not in RESERVED_TRAIN
)
RECIPE_ROOTS = ("skip", "linear", "optimizer", "description")
DEFAULT_BASELINES = ("bf16", "mxfp4")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

Setting = tuple[str, Any]  # (key, value): a recipe key, a training field or BASE_KEY
BASE_KEY = "base"  # an axis key: the recipe a point starts from (the file's `base` otherwise)


@dataclass(frozen=True)
class Axis:
    """One dimension of the grid: value labels and, per value, the settings it makes."""

    name: str
    labels: tuple[str, ...]
    settings: tuple[tuple[Setting, ...], ...]


@dataclass(frozen=True)
class SweepSpec:
    name: str
    description: str
    base: str  # a shipped recipe name or an absolute path
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    train: tuple[Setting, ...]
    baselines: tuple[str, ...]
    axes: tuple[Axis, ...]
    sample: int | None
    sample_seed: int
    exclude: tuple[dict[str, tuple[str, ...]], ...]
    tags: tuple[str, ...]
    source: str
    log_to: tuple[str, ...] = ()
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    baseline: str | None = None  # the report's reference recipe (a ref in `baselines`)

    @property
    def grid_size(self) -> int:
        size = 1
        for axis in self.axes:
            size *= len(axis.labels)
        return size

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, for the store's sweeps table."""
        d = dataclasses.asdict(self)
        d["axes"] = [
            {"name": a.name, "labels": list(a.labels), "settings": [list(s) for s in a.settings]}
            for a in self.axes
        ]
        return json.loads(json.dumps(d, default=str))


def label_of(value: Any) -> str:
    """An axis value's label: its YAML text on one line (`null`, `32`, `sr`, `{k: 5}`)."""
    if isinstance(value, str):
        return value
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000).strip()
    return text.removesuffix("\n...").strip()


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file; every problem is a one-line SweepError."""
    path = Path(path)
    if not path.exists():
        raise SweepError(f"no such sweep file {path}")
    if not path.is_file():
        raise SweepError(f"{path}: is not a regular file")
    try:
        raw = read_yaml_file(path)
    except ValueError as error:
        raise SweepError(f"{path}: {error}") from None
    return parse_sweep(raw, str(path), default_name=path.stem, relative_to=path.parent)


def parse_sweep(
    raw: Any, label: str, default_name: str = "sweep", relative_to: Path | None = None
) -> SweepSpec:
    """A SweepSpec from the file's mapping; `label` names the file in errors."""
    top = _mapping(raw, label, "", SWEEP_KEYS)
    name = top.get("name", default_name)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SweepError(f"{label}: name: must be letters, digits, '_', '.', '-' (got {name!r})")
    axes = tuple(_axis(key, value, label) for key, value in _mapping_of(top, "axes", label))
    _check_unique_settings(axes, label)
    sample = top.get("sample")
    if sample is not None and (not _is_int(sample) or not 1 <= sample <= MAX_POINTS):
        raise SweepError(
            f"{label}: sample: must be an integer from 1 to {MAX_POINTS:,} (got {sample!r})"
        )
    baselines = tuple(
        _recipe_ref(ref, label, "baselines", relative_to)
        for ref in _strings(top.get("baselines", list(DEFAULT_BASELINES)), label, "baselines")
    )
    named = top.get("baseline")
    baseline = _recipe_ref(named, label, "baseline", relative_to) if named is not None else None
    return SweepSpec(
        name=name,
        description=_string(top.get("description", ""), label, "description"),
        base=_recipe_ref(top.get("base", "mxfp4"), label, "base", relative_to),
        tasks=_strings(top.get("tasks", ["regression"]), label, "tasks"),
        seeds=_seeds(top.get("seeds", [0]), label),
        train=_train(top.get("train") or {}, label),
        baselines=baselines + ((baseline,) if baseline and baseline not in baselines else ()),
        baseline=baseline,
        axes=axes,
        sample=sample,
        sample_seed=_int(top.get("sample_seed", 0), label, "sample_seed"),
        exclude=_exclude(top.get("exclude") or [], axes, label),
        tags=_strings(top.get("tags", []), label, "tags"),
        source=label,
        log_to=_log_to(top.get("log_to"), label),
        cluster=parse_cluster(top.get("slurm"), label),
    )


def _log_to(raw: Any, label: str) -> tuple[str, ...]:
    from fp4cli.train.config import parse_log_to

    try:
        return parse_log_to(raw)
    except ConfigError as error:
        raise SweepError(f"{label}: {error}") from None


def is_train_key(key: str) -> bool:
    return key in TRAIN_FIELDS


def _axis(name: Any, raw: Any, label: str) -> Axis:
    where = f"axes.{name}"
    if not isinstance(name, str) or not name:
        raise SweepError(f"{label}: axes: an axis name must be a string (got {name!r})")
    if isinstance(raw, list):
        return _axis_of_values(name, [name], raw, label, where)
    if isinstance(raw, dict) and set(raw) == {"set", "values"}:
        keys = raw["set"] if isinstance(raw["set"], list) else [raw["set"]]
        if not isinstance(raw["values"], list):
            raise SweepError(f"{label}: {where}.values: must be a list of values")
        return _axis_of_values(name, keys, raw["values"], label, f"{where}.set")
    if isinstance(raw, dict) and raw:
        labels, settings = [], []
        for value_label, values in raw.items():
            here = f"{where}.{value_label}"
            if not isinstance(values, dict):
                raise SweepError(
                    f"{label}: {here}: must be a mapping of key: value (got {values!r})"
                )
            for key in values:
                _check_key(key, label, here)
            labels.append(label_of(value_label))
            settings.append(tuple(values.items()))
        return Axis(name, tuple(labels), tuple(settings))
    raise SweepError(
        f"{label}: {where}: must be a list of values, {{set: KEY, values: [...]}} or a mapping "
        f"of labels to {{key: value}} settings (got {raw!r})"
    )


def _axis_of_values(name: str, keys: list[Any], values: list[Any], label: str, where: str) -> Axis:
    for key in keys:
        _check_key(key, label, where)
    if not values:
        raise SweepError(f"{label}: {where}: has no values")
    labels = tuple(label_of(v) for v in values)
    if len(set(labels)) != len(labels):
        raise SweepError(f"{label}: {where}: repeats a value ({', '.join(labels)})")
    return Axis(name, labels, tuple(tuple((key, v) for key in keys) for v in values))


def _check_key(key: Any, label: str, where: str) -> None:
    if not isinstance(key, str) or not key:
        raise SweepError(f"{label}: {where}: a key must be a string (got {key!r})")
    if key in RESERVED_TRAIN:
        raise SweepError(f"{label}: {where}: {key!r} is set by the sweep itself (tasks, seeds)")
    if is_train_key(key) or key == BASE_KEY or key.split(".")[0] in RECIPE_ROOTS:
        return
    hint = did_you_mean(key, [*TRAIN_FIELDS, *RECIPE_ROOTS])
    raise SweepError(
        f"{label}: {where}: {key!r} is neither a training field nor a recipe key "
        f"(linear..., skip, optimizer...){hint}"
    )


def _check_unique_settings(axes: tuple[Axis, ...], label: str) -> None:
    names = [axis.name for axis in axes]
    seen: dict[str, str] = {}
    for axis in axes:
        for key in {key for values in axis.settings for key, _ in values}:
            if key in seen and seen[key] != axis.name:
                raise SweepError(
                    f"{label}: axes: {key!r} is set by both {seen[key]} and {axis.name}"
                )
            seen[key] = axis.name
    if len(set(names)) != len(names):
        raise SweepError(f"{label}: axes: repeated axis name")


def _exclude(
    raw: Any, axes: tuple[Axis, ...], label: str
) -> tuple[dict[str, tuple[str, ...]], ...]:
    if not isinstance(raw, list):
        raise SweepError(f"{label}: exclude: must be a list of {{axis: value}} rules")
    by_name = {axis.name: axis for axis in axes}
    rules = []
    for i, rule in enumerate(raw):
        where = f"exclude[{i}]"
        if not isinstance(rule, dict) or not rule:
            raise SweepError(f"{label}: {where}: must be a mapping of axis: value (got {rule!r})")
        checked = {}
        for name, values in rule.items():
            if name not in by_name:
                hint = did_you_mean(str(name), list(by_name))
                raise SweepError(f"{label}: {where}: no axis {name!r}{hint}")
            labels = tuple(label_of(v) for v in (values if isinstance(values, list) else [values]))
            for value_label in labels:
                if value_label not in by_name[name].labels:
                    known = ", ".join(by_name[name].labels)
                    raise SweepError(
                        f"{label}: {where}.{name}: {value_label!r} is not a value of the axis "
                        f"({known})"
                    )
            checked[name] = labels
        rules.append(checked)
    return tuple(rules)


def _train(raw: Any, label: str) -> tuple[Setting, ...]:
    if isinstance(raw, dict) and "log_to" in raw:
        raise SweepError(
            f"{label}: train.log_to: trackers are a top-level key of the sweep (log_to: "
            "[tensorboard]): they do not change what a point trains"
        )
    values = _mapping(raw, label, "train", TRAIN_FIELDS)
    try:
        TrainConfig(**values)
    except ConfigError as error:
        raise SweepError(f"{label}: train.{error}") from None
    return tuple(values.items())


def _recipe_ref(ref: Any, label: str, key: str, relative_to: Path | None) -> str:
    if not isinstance(ref, str) or not ref:
        raise SweepError(f"{label}: {key}: must be a recipe name or path (got {ref!r})")
    if names_a_file(ref):
        path = (relative_to or Path.cwd()) / Path(ref).expanduser()
        return str(path.resolve())
    return ref


def _seeds(raw: Any, label: str) -> tuple[int, ...]:
    seeds = raw if isinstance(raw, list) else [raw]
    if not seeds or not all(_is_int(s) for s in seeds):
        raise SweepError(f"{label}: seeds: must be a list of integers (got {raw!r})")
    for seed in seeds:
        if not 0 <= seed <= SEED_MAX:
            raise SweepError(f"{label}: seeds: each must be from 0 to 2^63 - 1 (got {seed})")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{label}: seeds: repeats a seed")
    return tuple(seeds)


def _strings(raw: Any, label: str, key: str) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise SweepError(f"{label}: {key}: must be a list of names (got {raw!r})")
    return tuple(items)


def _mapping(raw: Any, label: str, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        where = f"{key}: " if key else ""
        raise SweepError(f"{label}: {where}must be a mapping (got {raw!r})")
    for name in raw:
        if name not in allowed:
            path = f"{key}.{name}" if key else str(name)
            hint = did_you_mean(str(name), allowed)
            raise SweepError(f"{label}: {path}: unknown key{hint}; allowed: {', '.join(allowed)}")
    return dict(raw)


def _mapping_of(top: Mapping[str, Any], key: str, label: str) -> list[tuple[Any, Any]]:
    raw = top.get(key) or {}
    if not isinstance(raw, dict):
        raise SweepError(f"{label}: {key}: must be a mapping of axis name: values (got {raw!r})")
    return list(raw.items())


def _string(value: Any, label: str, key: str) -> str:
    if not isinstance(value, str):
        raise SweepError(f"{label}: {key}: must be a string (got {value!r})")
    return value


def _int(value: Any, label: str, key: str) -> int:
    if not _is_int(value):
        raise SweepError(f"{label}: {key}: must be an integer (got {value!r})")
    return int(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
