"""`fp4 reproduce`: a study's claims judged on its runs, seed by seed.

A study's runs are the done points of its sweep plan; each is one seed of one arm (a baseline
recipe, named by its recipe, or a grid point, named by its label). Values come from
`fp4 report`'s rows (fp4cli.analysis.report): the final primary metric, its gap to the bf16 run
of the same seed (positive is worse, for top1 too) and the cost model's estimate; weight
statistics (osc_share, rate_qw, ...) are the mean over layers at a run's last statistics step,
as `fp4 oscillation-report` shows them.

Each claim becomes per-seed contrasts, positive where it holds (fp4cli.analysis.stats):

    closes  c = (1 - share) gap(of) - gap(arm)
    better  c = gap(than) - gap(arm)
    lower   c = m(than) - m(arm);  higher: c = m(arm) - m(than)
    pareto  for every other arm costing no more (bf16 aside): c = gap(other) - gap(arm)
    axis    per level of `at_equal`: c = the mean over matched pairs of gap(than) - gap(arm)

A claim of one contrast takes its paired t-test's verdict. A claim of several (pareto: one per
cheaper arm; axis: one per level) is reproduced when every one is reproduced (an
intersection-union test, level alpha), not reproduced when any one fails at alpha / k
(Bonferroni over its k tests), inconclusive otherwise. Seeds where a run is missing or
diverged are left out of a contrast, and noted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fp4cli.analysis.oscillation import METRICS as WEIGHT_STATS
from fp4cli.analysis.stats import (
    ALPHA,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    PairedTest,
    mean_std,
    paired_test,
)
from fp4cli.analysis.study import Claim, Study

MeanStd = tuple[float, float]
HOLDS, FAILS, OPEN = "holds", "fails", "open"  # one test of a claim of several


@dataclass
class ArmLine:
    """One arm in a claim's table: its seeds' mean and std of the claim's metric and gap."""

    arm: str
    seeds: int
    value: MeanStd
    gap: MeanStd | None = None
    cost: float | None = None
    paper: float | None = None


@dataclass
class Comparison:
    """One paired test of a claim: what it compares, its test and the test's own verdict."""

    label: str
    test: PairedTest
    verdict: str


@dataclass
class ClaimResult:
    claim: Claim
    metric: str
    lines: list[ArmLine]
    comparisons: list[Comparison]
    verdict: str
    observed: MeanStd | None = None  # the claim's own number (closed share, difference)
    paper_value: float | None = None  # the same number from the paper's values
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["claim"]["share"] = None if self.claim.share is None else float(self.claim.share)
        return _finite_or_none(data)


class StudyData:
    """The study's runs by arm and seed, with their report rows and statistics."""

    def __init__(self, store: Any, spec: Any, plan: Any, target: str, measured: bool) -> None:
        from fp4cli.analysis.report import build_report, primary_metric

        self.store = store
        self.metric = primary_metric(spec.tasks[0])
        self.arm_of = {point.id: arm_name(point) for point in plan.points}
        self.arms: dict[str, dict[int, Any]] = {name: {} for name in self.arm_of.values()}
        runs = [store.get_run(run_id) for run_id in plan.done.values()]
        self.report = build_report(store, runs, None, target, measured) if runs else None
        by_run = {row.run_id: row for row in (self.report.rows if self.report else [])}
        for point in plan.points:
            if point.id in plan.done:
                self.arms[self.arm_of[point.id]][point.seed] = by_run[plan.done[point.id]]
        self.grid = _grid_arms(spec, self.arm_of)
        self._stats: dict[tuple[str, str], float | None] = {}

    def gaps(self, arm: str) -> dict[int, float]:
        """seed -> gap to bf16 (inf for a diverged run), where the seed's bf16 run is done."""
        return {s: r.gap for s, r in self.arms.get(arm, {}).items() if r.gap is not None}

    def values(self, arm: str, metric: str) -> dict[int, float]:
        """seed -> the arm's `metric` (a final metric or a weight statistic), where known."""
        found = {}
        for seed, row in self.arms.get(arm, {}).items():
            value = self._value(row, metric)
            if value is not None:
                found[seed] = value
        return found

    def cost(self, arm: str) -> float | None:
        costs = [r.cost_ratio for r in self.arms.get(arm, {}).values() if r.cost_ratio]
        return sum(costs) / len(costs) if costs else None

    def _value(self, row: Any, metric: str) -> float | None:
        if row.status != "finished":
            return None
        if metric == row.metric:
            return float(row.value)
        key = (row.run_id, metric)
        if key not in self._stats:
            self._stats[key] = self._lookup(row.run_id, metric)
        return self._stats[key]

    def _lookup(self, run_id: str, metric: str) -> float | None:
        if metric in WEIGHT_STATS:
            from fp4cli.analysis.oscillation import RunOscillation, summarize, weight_series

            layers = weight_series(self.store.quant_stats(run_id, operand="weight"))
            if not any(metric in series for series in layers.values()):
                return None
            run = RunOscillation(run_id, "", "", layers)
            return summarize(run, "last").overall.get(metric)
        return self.store.final_metrics(run_id, [metric]).get(metric)


def arm_name(point: Any) -> str:
    """A point's arm: its recipe's name for a baseline, else its label (axis=value,...)."""
    from fp4cli.sweep.points import BASELINE

    return str(point.recipe["name"]) if point.label == BASELINE else str(point.label)


def _grid_arms(spec: Any, arm_of: dict[str, str]) -> list[tuple[dict[str, str], str]]:
    """Every grid point's axis values and the arm that trains it (a baseline equal to it, or
    itself)."""
    if not spec.axes:
        return []
    from fp4cli.sweep import expand_points

    grid = expand_points(dataclasses.replace(spec, baselines=(), baseline=None))
    arms = {_key(p.choices): (p.choices, arm_of[p.id]) for p in grid if p.id in arm_of}
    return list(arms.values())  # once per point, not per seed


def evaluate(study: Study, data: StudyData) -> list[ClaimResult]:
    judges = {
        "closes": _closes,
        "better": _better,
        "within": _within,
        "lower": _metric,
        "higher": _metric,
        "pareto": _pareto,
        "axis": _axis,
    }
    return [judges[claim.kind](claim, data) for claim in study.claims]


def _closes(claim: Claim, data: StudyData) -> ClaimResult:
    assert claim.other is not None and claim.share is not None
    arm, of, keep = claim.arm, claim.other, 1.0 - float(claim.share)
    gaps_arm, gaps_of = data.gaps(arm), data.gaps(of)
    contrasts, notes = _paired(gaps_arm, gaps_of, lambda a, b: keep * b - a, (arm, of))
    closed = [1.0 - gaps_arm[s] / gaps_of[s] for s in contrasts if gaps_of[s] > 0]
    test = paired_test(list(contrasts.values()))
    verdict = test.verdict
    of_gap, _ = mean_std([g for g in gaps_of.values() if math.isfinite(g)])
    if verdict != INCONCLUSIVE and not of_gap > 0:
        notes.append(f"{of} has no gap to bf16 to close (mean {of_gap:+.4g}): inconclusive")
        verdict = INCONCLUSIVE
    label = f"{_fraction(1 - claim.share)} gap({of}) - gap({arm})"
    result = _result(
        claim, data, data.metric, [arm, of], [Comparison(label, test, verdict)], verdict, notes
    )
    result.observed = mean_std(closed) if closed else None
    result.paper_value = _paper_closed(claim)
    return result


def _better(claim: Claim, data: StudyData) -> ClaimResult:
    assert claim.other is not None
    arm, than = claim.arm, claim.other
    contrasts, notes = _paired(data.gaps(arm), data.gaps(than), lambda a, b: b - a, (arm, than))
    test = paired_test(list(contrasts.values()))
    comparison = Comparison(f"gap({than}) - gap({arm})", test, test.verdict)
    result = _result(claim, data, data.metric, [arm, than], [comparison], test.verdict, notes)
    differences = [-c for c in contrasts.values()]  # gap(arm) - gap(than): negative is better
    result.observed = mean_std(differences) if differences else None
    result.paper_value = _paper_difference(claim)
    return result


def _within(claim: Claim, data: StudyData) -> ClaimResult:
    """gap(arm) - gap(of) below the margin on every seed's pairing, by the paired test of
    margin - (gap(arm) - gap(of))."""
    assert claim.other is not None and claim.margin is not None
    arm, of, margin = claim.arm, claim.other, claim.margin
    contrasts, notes = _paired(
        data.gaps(arm), data.gaps(of), lambda a, b: margin - (a - b), (arm, of)
    )
    test = paired_test(list(contrasts.values()))
    label = f"{margin:g} - (gap({arm}) - gap({of}))"
    comparison = Comparison(label, test, test.verdict)
    result = _result(claim, data, data.metric, [arm, of], [comparison], test.verdict, notes)
    differences = [margin - c for c in contrasts.values()]
    result.observed = mean_std(differences) if differences else None
    return result


def _metric(claim: Claim, data: StudyData) -> ClaimResult:
    assert claim.other is not None and claim.metric is not None
    arm, than, metric = claim.arm, claim.other, claim.metric
    sign = 1.0 if claim.kind == "lower" else -1.0
    values_arm, values_than = data.values(arm, metric), data.values(than, metric)
    contrasts, notes = _paired(values_arm, values_than, lambda a, b: sign * (b - a), (arm, than))
    if not values_arm or not values_than:
        hint = " (weight statistics need stats_every in train:)" if metric in WEIGHT_STATS else ""
        notes.append(f"no {metric} recorded for {arm if not values_arm else than}{hint}")
    test = paired_test(list(contrasts.values()))
    pair = (than, arm) if sign > 0 else (arm, than)
    label = f"{metric}({pair[0]}) - {metric}({pair[1]})"
    comparison = Comparison(label, test, test.verdict)
    result = _result(claim, data, metric, [arm, than], [comparison], test.verdict, notes)
    differences = [values_arm[s] - values_than[s] for s in contrasts]
    result.observed = mean_std(differences) if differences else None
    result.paper_value = _paper_difference(claim)
    return result


def _pareto(claim: Claim, data: StudyData) -> ClaimResult:
    from fp4cli.analysis.report import pareto_front

    arm = claim.arm
    cost = data.cost(arm)
    notes: list[str] = []
    if cost is None:
        notes.append(f"{arm} has no cost estimate (no finished run recorded layer shapes)")
        return _result(claim, data, data.metric, [arm], [], INCONCLUSIVE, notes)
    rivals = [name for name in data.arms if name not in (arm, "bf16")]
    cheaper = [n for n in rivals if (c := data.cost(n)) is not None and c <= cost + 1e-12]
    cheaper.sort(key=lambda name: _mean_gap(data, name))
    comparisons = []
    for rival in cheaper:
        contrasts, more = _paired(
            data.gaps(arm), data.gaps(rival), lambda a, b: b - a, (arm, rival)
        )
        notes += more
        test = paired_test(list(contrasts.values()))
        comparisons.append(Comparison(f"gap({rival}) - gap({arm})", test, test.verdict))
    verdict = _all_or_any(comparisons, len(data.gaps(arm)))
    if not comparisons:
        notes.append(f"no other arm costs as little as {arm} ({cost:.2f}x): on the front")
    result = _result(claim, data, data.metric, [arm, *cheaper], comparisons, verdict, notes)
    scored = [
        n for n in [arm, *rivals] if data.cost(n) is not None and _mean_gap(data, n) < math.inf
    ]
    points = [(_mean_gap(data, n), data.cost(n) or 0.0) for n in scored]
    on_front = arm in scored and scored.index(arm) in pareto_front(points)
    result.observed = (1.0 if on_front else 0.0, math.nan)  # on the front of the seed means
    return result


def _axis(claim: Claim, data: StudyData) -> ClaimResult:
    assert claim.axis is not None and claim.other is not None
    levels: dict[str, list[tuple[str, str]]] = {}  # level label -> (arm's arm, than's arm)
    by_choices = {_key(choices): name for choices, name in data.grid}
    for choices, name in data.grid:
        if choices[claim.axis] != claim.arm:
            continue
        partner = by_choices.get(_key(choices | {claim.axis: claim.other}))
        if partner is None:
            continue
        level = ",".join(f"{a}={choices[a]}" for a in claim.at_equal) or "all"
        levels.setdefault(level, []).append((name, partner))
    comparisons: list[Comparison] = []
    notes: list[str] = []
    for level, pairs in levels.items():
        contrasts = _pair_means(data, pairs, notes)
        test = paired_test(list(contrasts.values()))
        label = (
            f"{level}: gap({claim.axis}={claim.other}) - gap({claim.axis}={claim.arm}), "
            f"the mean of {len(pairs)} matched pair(s)"
        )
        comparisons.append(Comparison(label, test, test.verdict))
    if not levels:
        notes.append(f"no grid points pair {claim.axis}={claim.arm} with {claim.other}")
    seeds = min((c.test.n for c in comparisons), default=0)
    verdict = _all_or_any(comparisons, seeds)
    result = _result(claim, data, data.metric, [], comparisons, verdict, notes)
    result.lines = [_axis_line(data, claim, value) for value in (claim.arm, claim.other)]
    return result


def _pair_means(
    data: StudyData, pairs: Sequence[tuple[str, str]], notes: list[str]
) -> dict[int, float]:
    """seed -> the mean over pairs (arm, than) of gap(than) - gap(arm), over the pairs that
    have both at that seed."""
    per_seed: dict[int, list[float]] = {}
    for arm, than in pairs:
        contrasts, more = _paired(data.gaps(arm), data.gaps(than), lambda a, b: b - a, (arm, than))
        notes += more
        for seed, value in contrasts.items():
            per_seed.setdefault(seed, []).append(value)
    return {seed: sum(v) / len(v) for seed, v in sorted(per_seed.items())}


def _axis_line(data: StudyData, claim: Claim, value: str) -> ArmLine:
    """The grid points with axis = value: per seed the mean of their metric and of their gap,
    then the mean and std over seeds."""
    assert claim.axis is not None
    names = [n for choices, n in data.grid if choices[claim.axis] == value]
    metric: dict[int, list[float]] = {}
    gaps: dict[int, list[float]] = {}
    for name in names:
        for seed, v in data.values(name, data.metric).items():
            metric.setdefault(seed, []).append(v)
        for seed, gap in data.gaps(name).items():
            if math.isfinite(gap):
                gaps.setdefault(seed, []).append(gap)
    metric_means = [sum(v) / len(v) for v in metric.values()]
    gap_means = [sum(v) / len(v) for v in gaps.values()]
    label = f"{claim.axis}={value} ({len(names)} points)"
    return ArmLine(label, len(metric_means), mean_std(metric_means), mean_std(gap_means))


def _all_or_any(comparisons: Sequence[Comparison], seeds: int) -> str:
    """Mark each test holds (p < alpha), fails (p < alpha / k the other way) or open; the claim
    is reproduced when every test holds, not reproduced when any one fails."""
    corrected = ALPHA / max(len(comparisons), 1)
    for comparison in comparisons:
        test = comparison.test
        if test.n >= 2 and test.mean > 0 and test.p_holds < ALPHA:
            comparison.verdict = HOLDS
        elif test.n >= 2 and test.mean < 0 and test.p_fails < corrected:
            comparison.verdict = FAILS
        else:
            comparison.verdict = OPEN
    if seeds < 2:
        return INCONCLUSIVE
    if all(c.verdict == HOLDS for c in comparisons):
        return REPRODUCED
    if any(c.verdict == FAILS for c in comparisons):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def _paired(
    first: dict[int, float], second: dict[int, float], contrast: Any, names: tuple[str, str]
) -> tuple[dict[int, float], list[str]]:
    """seed -> contrast(first, second) over the seeds both have; a non-finite one (a diverged
    run) is left out and noted."""
    contrasts, notes = {}, []
    for seed in sorted(first.keys() & second.keys()):
        value = contrast(first[seed], second[seed])
        if math.isfinite(value):
            contrasts[seed] = value
        else:
            gone = [
                n
                for n, v in zip(names, (first[seed], second[seed]), strict=True)
                if not math.isfinite(v)
            ]
            notes.append(f"seed {seed} left out: {', '.join(gone)} diverged")
    return contrasts, notes


def _result(
    claim: Claim,
    data: StudyData,
    metric: str,
    arms: Sequence[str],
    comparisons: list[Comparison],
    verdict: str,
    notes: list[str],
) -> ClaimResult:
    shown = ["bf16", *arms] if metric == data.metric else list(arms)  # bf16 has no weight stats
    lines = [_line(data, arm, metric, claim) for arm in shown if arm in data.arms]
    unique = list({line.arm: line for line in lines}.values())
    return ClaimResult(claim, metric, unique, comparisons, verdict, notes=_unique(notes))


def _line(data: StudyData, arm: str, metric: str, claim: Claim) -> ArmLine:
    values = [v for v in data.values(arm, metric).values() if math.isfinite(v)]
    gaps = [g for g in data.gaps(arm).values() if math.isfinite(g)]
    paper = _paper_values(claim).get(arm)
    with_gap = metric == data.metric and arm != "bf16"
    return ArmLine(
        arm,
        len(values),
        mean_std(values),
        mean_std(gaps) if with_gap else None,
        data.cost(arm),
        paper,
    )


def _paper_closed(claim: Claim) -> float | None:
    from fp4cli.analysis.report import HIGHER_IS_BETTER

    values = claim.paper.values
    if claim.other is None or not all(k in values for k in ("bf16", claim.arm, claim.other)):
        return None
    higher = claim.paper.metric in HIGHER_IS_BETTER
    sign = -1.0 if higher else 1.0
    gap_arm = sign * (values[claim.arm] - values["bf16"])
    gap_of = sign * (values[claim.other] - values["bf16"])
    return 1.0 - gap_arm / gap_of if gap_of > 0 else None


def _paper_values(claim: Claim) -> dict[str, float]:
    """The paper's values beside a claim: for a claim on another metric than the paper's
    (a weight statistic), only those of that metric."""
    on_metric = claim.kind not in ("lower", "higher") or claim.paper.metric == claim.metric
    return claim.paper.values if on_metric else {}


def _paper_difference(claim: Claim) -> float | None:
    """The paper's arm - other, in the paper's metric."""
    values = _paper_values(claim)
    if claim.other is None or claim.arm not in values or claim.other not in values:
        return None
    return values[claim.arm] - values[claim.other]


def _mean_gap(data: StudyData, arm: str) -> float:
    gaps = [g for g in data.gaps(arm).values() if math.isfinite(g)]
    return sum(gaps) / len(gaps) if gaps else math.inf


def _key(choices: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(choices.items()))


def _fraction(value: Any) -> str:
    return str(value) if getattr(value, "denominator", 1) != 1 else str(int(value))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    return value
