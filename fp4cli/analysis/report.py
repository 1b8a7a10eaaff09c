"""`fp4 report`: final metrics of chosen runs against BF16 and a baseline recipe, the
estimated cost of each recipe, and the Pareto front of the two.

A run's references are the finished runs of the recipe `bf16` and of the baseline recipe
(`mxfp4`, naive MXFP4, unless the report names another: a paper's own baseline such as
`tseng-baseline`, `tetrajet-baseline` or `wang-direct`, or a sweep file's `baseline:`) with the
same task, size, steps, batch size, seed, data and model fields (of the same sweep when there
is one, else the newest). On the task's primary metric (val_loss, eval_loss: lower is better;
top1: higher is better):

    gap    = metric - bf16 metric          (top1: bf16 top1 - top1): a positive gap is worse
    closed = 1 - gap / gap(baseline)       the share of the baseline's gap the recipe closes

A diverged run has an infinite gap. The estimated cost is the cost model's time of the run's
linear layers (the GEMM shapes its first step recorded) with the recipe, over the same layers in
BF16, on a target device profile (fp4cli.cost). The Pareto front is the quantized runs that no
other quantized run beats on both gap and cost (BF16 is the reference point, not a candidate:
on a GPU without FP4 tensor cores it would beat everything).

For runs trained with `--stats-every`, the row also has FP4 All the Way's stopping rule
(fp4cli.analysis.grad_noise): the model's weight-gradient norm over its quantization noise at
the last statistics step, and the first statistics step at which it fell below sqrt(3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fp4cli.analysis.errors import AnalysisError

PRIMARY_METRICS = {
    "regression": "val_loss",
    "vit": "top1",
    "diffusion": "eval_loss",
    "gpt": "val_loss",
    "llama": "val_loss",
}
HIGHER_IS_BETTER = ("top1",)
DEFAULT_BASELINE = "mxfp4"
KEY_FIELDS = ("size", "steps", "batch_size", "data")  # with task, seed, model: comparable runs


@dataclass
class ReportRow:
    run_id: str
    label: str  # the run's name (a sweep point's axis values), else its recipe
    task: str
    recipe: str
    seed: int
    status: str
    metric: str
    value: float
    bf16: float | None = None  # the bf16 baseline's metric
    gap: float | None = None
    baseline_gap: float | None = None  # the baseline recipe's gap (mxfp4 unless chosen)
    closed: float | None = None
    cost_ratio: float | None = None  # estimated time / BF16 time of the run's linear layers
    pareto: bool = False
    baseline_runs: dict[str, str] = field(default_factory=dict)  # recipe -> run id
    point: int = 0  # the number of its (task, label) in the report: its seeds share it
    noise_ratio: float | None = None  # ||dW|| / ||its quantization noise||, last stats step
    noise_below_step: int | None = None  # the first stats step with that ratio below sqrt(3)


@dataclass
class Report:
    rows: list[ReportRow]
    target: str  # the cost model's device profile
    notes: list[str] = field(default_factory=list)
    baseline: str = DEFAULT_BASELINE  # the recipe whose gap `closed` is a share of

    def to_dict(self) -> dict[str, Any]:
        runs = [asdict(r) for r in self.rows]
        return {"target": self.target, "baseline": self.baseline, "notes": self.notes, "runs": runs}


def select_runs(
    store: Any,
    run_ids: Sequence[str] = (),
    sweep: str | None = None,
    tag: str | None = None,
    task: str | None = None,
) -> list[dict[str, Any]]:
    """The runs named, or those of a sweep or tag, or every run; finished or diverged only."""
    if not store.list_runs(limit=1):
        raise AnalysisError(f"the run store {store.path} has no runs yet: fp4 train or fp4 sweep")
    if run_ids:
        runs = [store.get_run(run_id) for run_id in run_ids]
    else:
        sweep_id = store.get_sweep(sweep)["id"] if sweep is not None else None
        runs = store.list_runs(sweep=sweep_id, tag=tag, task=task)
        if not runs:
            what = f"tag {tag!r}" if tag else f"task {task!r}" if task else f"sweep {sweep!r}"
            raise AnalysisError(f"no runs with {what} in {store.path}")
    if task is not None:
        runs = [run for run in runs if run["task"] == task]
    done = [run for run in runs if run["status"] in ("finished", "diverged")]
    if not done:
        raise AnalysisError("none of the chosen runs has finished (see fp4 runs list)")
    return done


def sweep_baseline(store: Any, sweep: str | None) -> str | None:
    """The baseline recipe a sweep file names (`baseline:`), or None (no sweep, or one that
    names none: mxfp4)."""
    if sweep is None:
        return None
    ref = store.get_sweep(sweep)["spec"].get("baseline")
    if not ref:
        return None
    from pathlib import Path

    from fp4cli.recipe_loader import names_a_file

    return Path(ref).stem if names_a_file(ref) else str(ref)


def build_report(
    store: Any,
    runs: Sequence[dict[str, Any]],
    metric: str | None = None,
    target: str = "h100",
    measured: bool = True,
    baseline: str | None = None,
    require_baseline: bool = True,
) -> Report:
    """Rows for `runs` with their gaps, the share of the baseline recipe's gap each closes
    (`baseline`, default mxfp4), and their estimated costs; the Pareto front marked. A named
    baseline without a comparable finished run is an error when `require_baseline` (a baseline
    asked for), else a note (a running sweep's `baseline:` that has not finished yet)."""
    from fp4cli.cost import profile_for

    profile = profile_for(target)
    rates, note = _rates(store, profile, measured)
    notes = [f"cost model: {profile.name} profile; {note}"]
    named, baseline = baseline is not None, baseline or DEFAULT_BASELINE
    report = Report([], profile.name, notes, baseline)
    baselines = _Baselines(store, ("bf16", baseline))
    if named and not baselines.by_key.keys() & _keys_of(baseline, runs):
        if require_baseline:
            raise AnalysisError(
                f"no finished run of the baseline recipe {baseline!r} comparable to the chosen "
                f"runs (same task, size, steps, batch, seed, data, model fields): train it, or "
                f"list it in the sweep's baselines"
            )
        notes.append(f"no finished run of the baseline {baseline!r} yet: no closed shares")
    for run in runs:
        row = _row(store, run, metric)
        _compare(row, run, baselines, baseline)
        row.cost_ratio = _cost_ratio(store, run, profile, rates)
        _grad_noise(store, row)
        report.rows.append(row)
    mark_pareto(report.rows)
    report.rows.sort(key=_rank)
    number_points(report.rows)
    if any(row.cost_ratio is None for row in report.rows):
        report.notes.append("no cost for runs that recorded no layer shapes (older runs)")
    return report


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (gap, cost) that no other point beats on both (lower is better);
    of equal points, the first."""
    front = []
    for i, (gap, cost) in enumerate(points):
        dominated = any(
            (g <= gap and c <= cost and (g < gap or c < cost)) or ((g, c) == (gap, cost) and j < i)
            for j, (g, c) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front


def mark_pareto(rows: Sequence[ReportRow]) -> None:
    scored = [
        r for r in rows if r.recipe not in ("bf16",) and _finite(r.gap) and _finite(r.cost_ratio)
    ]
    points = [(float(r.gap), float(r.cost_ratio)) for r in scored]  # type: ignore[arg-type]
    for i in pareto_front(points):
        scored[i].pareto = True


def number_points(rows: Sequence[ReportRow]) -> None:
    """Number each (task, label) 1, 2, ... in the order the rows come (best first); the
    figures and the table name a point by this number."""
    numbers: dict[tuple[str, str], int] = {}
    for row in rows:
        row.point = numbers.setdefault((row.task, row.label), len(numbers) + 1)


def primary_metric(task: str) -> str:
    return PRIMARY_METRICS.get(task, "val_loss")


def _row(store: Any, run: dict[str, Any], metric: str | None) -> ReportRow:
    name = metric or primary_metric(run["task"])
    finals = store.final_metrics(run["id"], [name])
    if run["status"] == "finished" and name not in finals:
        raise AnalysisError(f"run {run['id']} ({run['task']}) has no metric {name!r}")
    value = finals[name] if run["status"] == "finished" else math.nan
    label = run.get("name") or run["recipe"]
    return ReportRow(
        run["id"], label, run["task"], run["recipe"], run["seed"], run["status"], name, value
    )


def _keys_of(recipe: str, runs: Sequence[dict[str, Any]]) -> set[tuple[Any, ...]]:
    return {(recipe, *_comparable(run)) for run in runs}


class _Baselines:
    """The finished runs of the reference recipes (bf16 and the baseline) by comparable key,
    and their final metrics, each looked up once for the whole report."""

    def __init__(self, store: Any, recipes: Sequence[str]) -> None:
        self.store = store
        self.by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for run in store.list_runs(status="finished"):  # newest first
            if run["recipe"] in recipes:
                self.by_key.setdefault((run["recipe"], *_comparable(run)), []).append(run)
        self.values: dict[tuple[str, str], float | None] = {}

    def find(self, run: dict[str, Any], recipe: str) -> dict[str, Any] | None:
        """The newest baseline run of `recipe` for `run`, of the same sweep when there is one."""
        if run["recipe"] == recipe and run["status"] == "finished":
            return run
        matches = self.by_key.get((recipe, *_comparable(run)), [])
        same_sweep = [m for m in matches if run.get("sweep") and m.get("sweep") == run["sweep"]]
        found = same_sweep or matches
        return found[0] if found else None

    def value(self, run_id: str, metric: str) -> float | None:
        if (run_id, metric) not in self.values:
            finals = self.store.final_metrics(run_id, [metric])
            self.values[run_id, metric] = finals.get(metric)
        return self.values[run_id, metric]


def _compare(row: ReportRow, run: dict[str, Any], baselines: _Baselines, baseline: str) -> None:
    """Fill the row's bf16 value, gap, the baseline's gap and the closed share."""
    values: dict[str, float] = {}
    for recipe in ("bf16", baseline):
        reference = baselines.find(run, recipe)
        if reference is not None:
            row.baseline_runs[recipe] = reference["id"]
            value = baselines.value(reference["id"], row.metric)
            if value is not None:
                values[recipe] = value
    bf16 = values.get("bf16")
    if bf16 is None or not math.isfinite(bf16):
        return
    row.bf16 = bf16
    row.gap = _gap(row.metric, row.value, bf16)
    if values.get(baseline) is not None:
        row.baseline_gap = _gap(row.metric, values[baseline], bf16)
        if row.baseline_gap > 0 and math.isfinite(row.gap):
            row.closed = 1 - row.gap / row.baseline_gap


def _gap(metric: str, value: float, bf16: float) -> float:
    if not math.isfinite(value):
        return math.inf
    return bf16 - value if metric in HIGHER_IS_BETTER else value - bf16


def _comparable(run: dict[str, Any]) -> tuple[Any, ...]:
    train = run["config"].get("train", {})
    model = tuple(sorted((train.get("model") or {}).items()))  # --set model.FIELD=VALUE
    return (run["task"], run["seed"], *(train.get(name) for name in KEY_FIELDS), str(model))


def _grad_noise(store: Any, row: ReportRow) -> None:
    """Fill the row's gradient-to-noise ratio and the step it first fell below sqrt(3)
    (both None for a run without the statistic)."""
    from fp4cli.analysis.grad_noise import crossing_step, load_grad_noise

    series = load_grad_noise(store, row.run_id)
    if series:
        row.noise_ratio = series[-1].ratio
        row.noise_below_step = crossing_step(series)


def _cost_ratio(store: Any, run: dict[str, Any], profile: Any, rates: Any) -> float | None:
    from fp4cli.cost import LayerShape, estimate_model
    from fp4cli.recipes import Recipe

    layers = store.layers(run["id"])
    if not layers:
        return None
    shapes = [
        LayerShape(row["tokens"], row["in_features"], row["out_features"], row["quantized"])
        for row in layers
    ]
    recipe = Recipe.from_dict(run["config"]["recipe"], source=f"run {run['id']}")
    cost = estimate_model(recipe.linear, shapes, profile, rates, qramp=recipe.qramp)
    return float(cost.ratio)


def _rates(store: Any, profile: Any, measured: bool) -> tuple[Any, str]:
    from fp4cli.cost import measured_rates

    if not measured:
        return None, "modelled rates only (--no-measured)"
    rates = measured_rates(store, profile)
    if not len(rates):
        return None, f"modelled rates (no fp4 bench quantize rows of a {profile.name} in the store)"
    return rates, f"{len(rates)} measured quantize rates from fp4 bench quantize"


def _rank(row: ReportRow) -> tuple[int, float, str]:
    gap = row.gap if row.gap is not None and not math.isnan(row.gap) else math.inf
    return (0 if row.gap is not None else 1, gap, row.run_id)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
