"""The study file of `fp4 reproduce`: a sweep file (fp4cli/sweep/spec.py) plus the paper's
numbers and its claims as testable statements.

    name: tseng
    description: ...
    base: tseng-baseline          # the sweep part: base, tasks (one), seeds (3 or more),
    tasks: [gpt]                  # train, baselines (bf16 among them), baseline, axes...
    seeds: [0, 1, 2]
    train: {size: default, steps: 2000, checkpoints: false}
    baselines: [bf16, tseng-baseline, tseng-rht-sr]
    axes:
      variant:
        rht: {linear.grad_*.hadamard: 64}
    paper:                        # the paper's own numbers, beside the study's
      citation: Tseng, Yu, Park, Training LLMs with MXFP4 (arXiv 2502.20586)
      setting: GPT 345M, 33B tokens
      metric: val_loss            # the metric of `values`
      values: {bf16: 2.49, tseng-baseline: 2.60, variant=rht: 2.51, tseng-rht-sr: 2.51}
    claims:
      - statement: tseng-rht-sr's gap to bf16 is at most a third of tseng-baseline's
        kind: closes              # arm closes at least `share` of `of`'s gap to bf16
        arm: tseng-rht-sr
        of: tseng-baseline
        share: 2/3

An arm is a recipe of `baselines` (by name), a grid point by its label (`variant=rht`, axes in
file order), or a grid point by its axis values (`{variant: rht}`). Claim kinds:

    closes   arm, of, share        gap(arm) <= (1 - share) gap(of)   (gaps to bf16, per seed)
    better   arm, than             arm's primary metric is better (val_loss lower, top1 higher)
    within   arm, of, margin       gap(arm) - gap(of) <= margin (per seed): arm trains as well
                                     as `of` within `margin` of the primary metric
    lower    arm, than, metric     arm's `metric` is lower (a final metric, or a weight
    higher   arm, than, metric       statistic of --stats-every: osc_share, rate_qw, ...)
    pareto   arm                   arm is on the Pareto front of gap vs estimated cost
    axis     axis, arm, than,      the axis value `arm` has a smaller gap than `than`, the
             at_equal (optional)     other axes matched, at each value of the `at_equal` axes

A claim's `paper:` (setting, metric, values, note) adds to or replaces the study's for it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from fp4cli.analysis.errors import AnalysisError

STUDY_KEYS = ("paper", "claims")
CLAIM_KEYS = (
    "statement",
    "kind",
    "arm",
    "of",
    "than",
    "share",
    "margin",
    "metric",
    "axis",
    "at_equal",
    "paper",
)
KINDS = {  # kind -> its required keys besides statement and kind
    "closes": ("arm", "of", "share"),
    "better": ("arm", "than"),
    "within": ("arm", "of", "margin"),
    "lower": ("arm", "than", "metric"),
    "higher": ("arm", "than", "metric"),
    "pareto": ("arm",),
    "axis": ("axis", "arm", "than"),
}
OPTIONAL = {"axis": ("at_equal",)}
PAPER_KEYS = ("citation", "setting", "metric", "values", "note")
MIN_STUDY_SEEDS = 3


@dataclass(frozen=True)
class Paper:
    """What the paper reports: its setting, the metric of `values` and a value per arm."""

    citation: str = ""
    setting: str = ""
    metric: str = ""
    values: dict[str, float] = field(default_factory=dict)  # arm name -> the paper's number
    note: str = ""

    def merged(self, other: Paper) -> Paper:
        """This paper with the fields `other` gives replacing its own."""
        return Paper(
            other.citation or self.citation,
            other.setting or self.setting,
            other.metric or self.metric,
            other.values or self.values,
            other.note or self.note,
        )


@dataclass(frozen=True)
class Claim:
    number: int  # 1, 2, ... in the file's order
    kind: str
    statement: str
    arm: str  # an arm's name (resolved: a baseline recipe's or a grid point's label)
    other: str | None = None  # `of` / `than`: an arm's name (for `axis`: an axis value)
    share: Fraction | None = None
    margin: float | None = None  # within: the largest gap(arm) - gap(of) it allows
    metric: str | None = None
    axis: str | None = None
    at_equal: tuple[str, ...] = ()
    paper: Paper = field(default_factory=Paper)


@dataclass(frozen=True)
class Study:
    name: str
    source: str  # the file
    raw: dict[str, Any]  # the sweep part of the file, as read
    paper: Paper
    claims: tuple[Claim, ...]

    @property
    def description(self) -> str:
        return str(self.raw.get("description", ""))


@dataclass(frozen=True)
class Overrides:
    """What `fp4 reproduce` changes of a study: each None keeps the file's."""

    task: str | None = None
    size: str | None = None
    steps: int | None = None
    seeds: tuple[int, ...] | None = None
    data: str | None = None
    cpu: bool = False  # the runs train on a CPU: no CUDA graphs
    cuda_graph: bool | None = None  # replay steps from a CUDA graph (None: as the study says)
    train: tuple[tuple[str, Any], ...] = ()  # training fields to set (--set KEY=VALUE)

    def suffix(self) -> str:
        """The part of the sweep name that tells these runs from the study's own. The seeds
        are not part of it: a seed's runs are the same points whichever seeds are asked for,
        so `--seeds 0,1,2` and the default's five share their finished runs."""
        parts = [f"task_{self.task}"] if self.task else []
        parts += [f"size_{self.size}"] if self.size else []
        parts += [f"steps_{self.steps}"] if self.steps else []
        if self.data:
            parts.append("data_" + hashlib.sha1(self.data.encode()).hexdigest()[:8])
        if self.train:
            text = json.dumps(sorted(self.train), sort_keys=True, default=str)
            parts.append("set_" + hashlib.sha1(text.encode()).hexdigest()[:8])
        return "-".join(parts)


def studies_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "studies"


def study_names() -> list[str]:
    """The shipped studies, sorted."""
    return sorted(path.stem for path in studies_dir().glob("*.yaml"))


def load_study(ref: str) -> Study:
    """A shipped study by name, or a study file by path; every problem is one line."""
    from fp4cli.recipe_loader import names_a_file, read_yaml_file

    if names_a_file(ref):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise AnalysisError(f"no such study file {path}")
    else:
        path = studies_dir() / f"{ref}.yaml"
        if not path.is_file():
            from fp4cli.recipe_schema import did_you_mean

            names = study_names()
            hint = did_you_mean(ref, names)
            raise AnalysisError(f"unknown study {ref!r}{hint}; studies: {', '.join(names)}")
    try:
        raw = read_yaml_file(path)
    except ValueError as error:
        raise AnalysisError(f"{path}: {error}") from None
    return parse_study(raw, str(path), default_name=path.stem)


def parse_study(raw: Any, label: str, default_name: str = "study") -> Study:
    """A Study from the file's mapping: its sweep part checked as a sweep file, its paper and
    claims against the sweep's arms."""
    if not isinstance(raw, dict):
        raise AnalysisError(f"{label}: must be a mapping (got {raw!r})")
    sweep_part = {k: v for k, v in raw.items() if k not in STUDY_KEYS}
    spec = study_spec_of(sweep_part, label, default_name)
    if len(spec.seeds) < MIN_STUDY_SEEDS:
        raise AnalysisError(
            f"{label}: seeds: a study needs at least {MIN_STUDY_SEEDS} seeds "
            f"(got {len(spec.seeds)})"
        )
    arms = Arms(spec)
    paper = _paper(raw.get("paper"), label, "paper", arms)
    claims_raw = raw.get("claims")
    if not isinstance(claims_raw, list) or not claims_raw:
        raise AnalysisError(f"{label}: claims: must be a list of claims (got {claims_raw!r})")
    claims = tuple(_claim(i + 1, c, label, arms, paper) for i, c in enumerate(claims_raw))
    return Study(spec.name, label, sweep_part, paper, claims)


def study_spec_of(sweep_part: dict[str, Any], label: str, default_name: str) -> Any:
    """The SweepSpec of a study's sweep part; a study trains one task, bf16 among its
    baselines (every gap is to it)."""
    from fp4cli.sweep import SweepError, parse_sweep

    try:
        spec = parse_sweep(
            sweep_part, label, default_name=default_name, relative_to=Path(label).parent
        )
    except SweepError as error:
        raise AnalysisError(str(error)) from None
    if len(spec.tasks) != 1:
        raise AnalysisError(f"{label}: tasks: a study trains one task (got {list(spec.tasks)})")
    if "bf16" not in spec.baselines:
        raise AnalysisError(f"{label}: baselines: must list bf16 (every gap is to it)")
    return spec


def study_spec(study: Study, overrides: Overrides) -> Any:
    """The SweepSpec that `fp4 reproduce` runs: the study's, with the overrides applied and
    named apart from the study's own runs when they change what is trained."""
    raw = dict(study.raw)
    train = dict(raw.get("train") or {})
    if overrides.task:
        raw["tasks"] = [overrides.task]
    train.update(dict(overrides.train))
    for key in ("size", "steps", "data"):
        if getattr(overrides, key) is not None:
            train[key] = getattr(overrides, key)
    if overrides.seeds:
        raw["seeds"] = list(overrides.seeds)
    if overrides.cuda_graph and overrides.cpu:
        raise AnalysisError("--cuda-graph: needs a CUDA device (the runs train on the CPU)")
    if overrides.cpu:
        train.pop("cuda_graph", None)  # the same numbers, eagerly: no CUDA device
    elif overrides.cuda_graph is not None:
        train["cuda_graph"] = overrides.cuda_graph
    raw["train"] = train
    suffix = overrides.suffix()
    raw["name"] = f"{study.name}-{suffix}" if suffix else study.name
    return study_spec_of(raw, study.source, study.name)


class Arms:
    """The arms of a study's sweep: its baseline recipes by name and its grid points by label;
    a reference (a name, a label, or a mapping of axis values) resolves to an arm's name."""

    def __init__(self, spec: Any) -> None:
        from fp4cli.recipe_loader import names_a_file

        self.spec = spec
        self.recipes = [Path(r).stem if names_a_file(r) else r for r in spec.baselines]
        self.axes = {axis.name: axis.labels for axis in spec.axes}

    def resolve(self, ref: Any, where: str) -> str:
        """The arm's name: a recipe name as given, a grid point as its label."""
        if isinstance(ref, str) and ref in self.recipes:
            return ref
        if isinstance(ref, str) and "=" in ref:
            pairs = [part.partition("=") for part in ref.split(",")]
            ref = {name.strip(): value.strip() for name, _, value in pairs}
        if isinstance(ref, dict) and self.axes:
            return self._label(ref, where)
        known = ", ".join(self.recipes)
        grid = " or a grid point (axis=value,...)" if self.axes else ""
        raise AnalysisError(f"{where}: {ref!r} is not an arm of the study: one of {known}{grid}")

    def _label(self, choices: dict[Any, Any], where: str) -> str:
        from fp4cli.recipe_schema import did_you_mean
        from fp4cli.sweep.spec import label_of

        for name in choices:
            if name not in self.axes:
                hint = did_you_mean(str(name), list(self.axes))
                raise AnalysisError(f"{where}: no axis {name!r}{hint}")
        missing = [name for name in self.axes if name not in choices]
        if missing:
            raise AnalysisError(
                f"{where}: a grid point names every axis (missing: {', '.join(missing)})"
            )
        labels = []
        for name, values in self.axes.items():
            value = label_of(choices[name])
            if value not in values:
                raise AnalysisError(
                    f"{where}: {value!r} is not a value of axis {name} ({', '.join(values)})"
                )
            labels.append(f"{name}={value}")
        return ",".join(labels)


def _claim(number: int, raw: Any, label: str, arms: Arms, paper: Paper) -> Claim:
    where = f"{label}: claims[{number - 1}]"
    if not isinstance(raw, dict):
        raise AnalysisError(f"{where}: must be a mapping (got {raw!r})")
    _known_keys(raw, CLAIM_KEYS, where)
    kind, statement = raw.get("kind"), raw.get("statement")
    if kind not in KINDS:
        raise AnalysisError(f"{where}.kind: must be one of {', '.join(KINDS)} (got {kind!r})")
    if not isinstance(statement, str) or not statement.strip():
        raise AnalysisError(f"{where}.statement: must be the claim in words")
    allowed = {"statement", "kind", "paper", *KINDS[kind], *OPTIONAL.get(kind, ())}
    for key in raw:
        if key not in allowed:
            raise AnalysisError(
                f"{where}.{key}: not a key of a {kind} claim (keys: {', '.join(sorted(allowed))})"
            )
    for key in KINDS[kind]:
        if raw.get(key) is None:
            raise AnalysisError(f"{where}.{key}: a {kind} claim needs it")
    own = _paper(raw.get("paper"), label, f"claims[{number - 1}].paper", arms)
    claim = Claim(number, kind, " ".join(statement.split()), "", paper=paper.merged(own))
    if kind == "axis":
        return _axis_claim(claim, raw, where, arms)
    other_key = "of" if kind in ("closes", "within") else "than"
    values: dict[str, Any] = {"arm": arms.resolve(raw["arm"], f"{where}.arm")}
    if kind != "pareto":
        values["other"] = arms.resolve(raw[other_key], f"{where}.{other_key}")
        if values["other"] == values["arm"]:
            raise AnalysisError(f"{where}: compares {values['arm']} with itself")
    if kind == "closes":
        values["share"] = _share(raw["share"], f"{where}.share")
    if kind == "within":
        values["margin"] = _margin(raw["margin"], f"{where}.margin")
    if kind in ("lower", "higher"):
        if not isinstance(raw["metric"], str) or not raw["metric"]:
            raise AnalysisError(f"{where}.metric: must be a metric name (got {raw['metric']!r})")
        values["metric"] = raw["metric"]
    return _replace(claim, **values)


def _margin(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw < float("inf"):
        raise AnalysisError(f"{where}: must be a finite number at least 0 (got {raw!r})")
    return float(raw)


def _axis_claim(claim: Claim, raw: dict[str, Any], where: str, arms: Arms) -> Claim:
    from fp4cli.sweep.spec import label_of

    axis = raw["axis"]
    if axis not in arms.axes:
        raise AnalysisError(f"{where}.axis: no axis {axis!r} (axes: {', '.join(arms.axes)})")
    values = arms.axes[axis]
    arm, other = label_of(raw["arm"]), label_of(raw["than"])
    for key, value in (("arm", arm), ("than", other)):
        if value not in values:
            raise AnalysisError(
                f"{where}.{key}: {value!r} is not a value of axis {axis} ({', '.join(values)})"
            )
    if arm == other:
        raise AnalysisError(f"{where}: compares {axis}={arm} with itself")
    at_equal = raw.get("at_equal") or []
    at_equal = [at_equal] if isinstance(at_equal, str) else at_equal
    if not isinstance(at_equal, list) or any(a not in arms.axes or a == axis for a in at_equal):
        raise AnalysisError(
            f"{where}.at_equal: must list other axes of the study (got {raw.get('at_equal')!r})"
        )
    return _replace(claim, axis=axis, arm=arm, other=other, at_equal=tuple(at_equal))


def _paper(raw: Any, label: str, key: str, arms: Arms) -> Paper:
    if raw is None:
        return Paper()
    where = f"{label}: {key}"
    if not isinstance(raw, dict):
        raise AnalysisError(f"{where}: must be a mapping of {', '.join(PAPER_KEYS)}")
    _known_keys(raw, PAPER_KEYS, where)
    for name in ("citation", "setting", "metric", "note"):
        if not isinstance(raw.get(name, ""), str):
            raise AnalysisError(f"{where}.{name}: must be text (got {raw[name]!r})")
    values = raw.get("values") or {}
    if not isinstance(values, dict):
        raise AnalysisError(f"{where}.values: must map arms to the paper's numbers")
    resolved = {}
    for ref, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise AnalysisError(f"{where}.values.{ref}: must be a number (got {value!r})")
        resolved[arms.resolve(ref, f"{where}.values")] = float(value)
    if resolved and not raw.get("metric"):
        raise AnalysisError(f"{where}.metric: name the metric of the paper's values")
    note = " ".join(str(raw.get("note", "")).split())
    text = {name: str(raw.get(name, "")) for name in ("citation", "setting", "metric")}
    return Paper(text["citation"], text["setting"], text["metric"], resolved, note)


def _share(raw: Any, where: str) -> Fraction:
    """A share of a gap: a number or a fraction 'p/q', from 0 (any improvement) below 1."""
    try:
        share = Fraction(str(raw)) if not isinstance(raw, bool) else None
    except (ValueError, ZeroDivisionError):
        share = None
    if share is None or not 0 <= share < 1:
        raise AnalysisError(
            f"{where}: must be a share from 0 up to (not including) 1, as a "
            f"number or p/q (got {raw!r})"
        )
    return share


def _known_keys(raw: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    from fp4cli.recipe_schema import did_you_mean

    for key in raw:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed)
            raise AnalysisError(f"{where}.{key}: unknown key{hint}; allowed: {', '.join(allowed)}")


def _replace(claim: Claim, **values: Any) -> Claim:
    import dataclasses

    return dataclasses.replace(claim, **values)
