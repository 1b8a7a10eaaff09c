"""`fp4 report`'s figures: the Pareto plane (gap vs estimated cost) and curves against BF16.

A point is a (task, label): a recipe, or a sweep's point, over its seeds. Both figures draw a
point with one colour (bf16 black, the report's baseline recipe red: mxfp4 unless it names
another; the others from one palette in the report's order) and name it by its number in the
report's table; seeds are a mean with a band (the curves) or a range (the plane), never one
line or marker each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp4cli.analysis.plots import new_figure, save_png
from fp4cli.analysis.report import Report, ReportRow, pareto_front

CURVE_POINTS = 8  # besides the baselines, the best points by gap get a curve
SMOOTHING = 0.9  # exponential moving average of the train loss
BF16_COLOUR, BASELINE_COLOUR = "black", "tab:red"
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
           "tab:olive", "tab:cyan", "navy", "teal")  # fmt: skip


@dataclass
class Point:
    """A recipe or sweep point over its seeds."""

    number: int
    label: str
    recipe: str
    rows: list[ReportRow]
    colour: str | None = None  # a baseline's own colour (bf16, the report's baseline)

    @property
    def is_baseline(self) -> bool:
        return self.colour is not None

    @property
    def name(self) -> str:
        if self.is_baseline:
            return self.recipe
        return f"#{self.number} {_short(self.label)}"

    def mean(self, field: str) -> float | None:
        values = [getattr(r, field) for r in self.rows if _finite(getattr(r, field))]
        return sum(values) / len(values) if values else None

    def spread(self, field: str) -> tuple[float, float] | None:
        values = [getattr(r, field) for r in self.rows if _finite(getattr(r, field))]
        return (min(values), max(values)) if len(values) > 1 else None


def points_of(report: Report) -> list[Point]:
    """The report's points in its order (best first), each with its seeds' rows."""
    own = {"bf16": BF16_COLOUR, report.baseline: BASELINE_COLOUR}
    points: dict[tuple[str, str], Point] = {}
    for row in report.rows:
        key = (row.task, row.label)
        if key not in points:
            colour = own.get(row.recipe)
            points[key] = Point(row.point or len(points) + 1, row.label, row.recipe, [], colour)
        points[key].rows.append(row)
    return list(points.values())


def colours(points: Sequence[Point]) -> dict[int, str]:
    """A colour per point number: the baselines' own, the palette for the others in order."""
    chosen, others = {}, 0
    for point in points:
        if point.colour is not None:
            chosen[point.number] = point.colour
        else:
            chosen[point.number] = PALETTE[others % len(PALETTE)]
            others += 1
    return chosen


def pareto_png(report: Report, path: str | Path) -> Path | None:
    """Every point with a gap and a cost (its seeds' mean, their range as a bar), numbered as in
    the table, the front joined; None if there is none."""
    points = [p for p in points_of(report) if p.mean("gap") is not None and p.mean("cost_ratio")]
    if not points:
        return None
    colour = colours(points_of(report))
    metric = report.rows[0].metric
    figure, (ax,) = new_figure(width=7.5, height=5.2)
    for point in points:
        x, y = point.mean("cost_ratio"), point.mean("gap")
        baseline = point.is_baseline
        spread = point.spread("gap")
        if spread is not None:
            ax.plot([x, x], spread, color=colour[point.number], lw=1.0, alpha=0.5)
        ax.scatter([x], [y], s=90 if baseline else 22, marker="*" if baseline else "o",
                   color=colour[point.number], zorder=3,
                   label=point.recipe if baseline else None)  # fmt: skip
        ax.annotate(point.recipe if baseline else str(point.number), (x, y), fontsize=7,
                    xytext=(4, 3), textcoords="offset points")  # fmt: skip
    front = pareto_points(points)
    if front:  # rings round the front's points, joined
        ax.plot([p.mean("cost_ratio") for p in front], [p.mean("gap") for p in front], "o-",
                color="0.3", lw=1.0, ms=13, mfc="none", zorder=2, label="Pareto front")  # fmt: skip
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xlabel(f"estimated time of the linear layers / BF16 ({report.target})")
    ax.set_ylabel(f"{metric} gap to BF16 (lower is better)")
    seeds = max(len(p.rows) for p in points)
    over = f", mean of {seeds} seeds (bars: their range)" if seeds > 1 else ""
    ax.set_title(f"{metric} gap vs estimated cost{over}; numbers: the rows' # in fp4 report",
                 fontsize="small")  # fmt: skip
    ax.legend(fontsize="x-small", loc="best")
    return save_png(figure, path)


def pareto_points(points: Sequence[Point]) -> list[Point]:
    """The points on the front of the plane as drawn: of their seeds' mean gap and cost, none
    beaten on both by another point (bf16, the reference, aside); cheapest first."""
    scored = [p for p in points if p.recipe != "bf16"]
    means = [(p.mean("gap"), p.mean("cost_ratio")) for p in scored]
    front = [scored[i] for i in pareto_front(means)]  # type: ignore[arg-type]
    return sorted(front, key=lambda p: p.mean("cost_ratio") or 0.0)


def curves_png(store: Any, report: Report, path: str | Path) -> Path:
    """The train loss (smoothed) and the primary metric over steps of the baselines and the
    best points, each a mean over its seeds with their range as a band; a metric evaluated only
    once per run is drawn as each point's final value instead."""
    points = _curve_points(points_of(report))
    colour = colours(points_of(report))
    metric = report.rows[0].metric if report.rows else "metric"
    figure, (loss_ax, metric_ax) = new_figure(1, 2, width=6.2, height=4.4)
    series = {p.number: _series(store, p, metric) for p in points}
    for point in points:
        train, _ = series[point.number]
        _band(loss_ax, train, colour[point.number], point.name, True, point.is_baseline)
    evaluations = max((len(m) for _, m in series.values()), default=0)
    if evaluations > 1:
        for point in points:
            _band(metric_ax, series[point.number][1], colour[point.number], point.name,
                  bold=point.is_baseline)  # fmt: skip
        metric_ax.set(xlabel="step", ylabel=metric, title=f"{metric} over steps")
    else:
        _final_values(metric_ax, points, colour, metric)
    loss_ax.set(xlabel="step", ylabel="train loss (smoothed)", yscale="log",
                title="train loss")  # fmt: skip
    seeds = max((len(p.rows) for p in points), default=1)
    title = f"lines: the mean of {seeds} seeds; bands: their range" if seeds > 1 else None
    loss_ax.legend(fontsize="x-small", title=title, title_fontsize="x-small")
    return save_png(figure, path)


def _curve_points(points: list[Point]) -> list[Point]:
    baselines = [p for p in points if p.is_baseline]
    others = [p for p in points if not p.is_baseline][:CURVE_POINTS]
    return baselines + others


def _series(store: Any, point: Point, metric: str) -> tuple[dict, dict]:
    """Per step, the values over the point's seeds: (train loss, metric)."""
    train: dict[int, list[float]] = {}
    evaluated: dict[int, list[float]] = {}
    for row in point.rows:
        for m in store.metrics(row.run_id, "train_loss"):
            train.setdefault(m["step"], []).append(m["value"])
        for m in store.metrics(row.run_id, metric):
            evaluated.setdefault(m["step"], []).append(m["value"])
    return train, evaluated


def _band(ax: Any, by_step: dict[int, list[float]], colour: str, label: str,
          smooth: bool = False, bold: bool = False) -> None:  # fmt: skip
    steps = sorted(by_step)
    if not steps:
        return
    mean = [_mean(by_step[s]) for s in steps]
    low = [min(by_step[s]) for s in steps]
    high = [max(by_step[s]) for s in steps]
    if smooth:
        mean, low, high = _smooth(mean), _smooth(low), _smooth(high)
    ax.plot(steps, mean, color=colour, lw=1.6 if bold else 1.1, label=label)
    if any(len(by_step[s]) > 1 for s in steps):
        ax.fill_between(steps, low, high, color=colour, alpha=0.15, lw=0)


def _final_values(ax: Any, points: list[Point], colour: dict[int, str], metric: str) -> None:
    """One row per point: its seeds' mean final metric, their range as a bar."""
    for position, point in enumerate(points):
        mean, spread = point.mean("value"), point.spread("value")
        if mean is None:
            continue
        if spread is not None:
            ax.plot(spread, [position, position], color=colour[point.number], lw=2, alpha=0.4)
        ax.scatter([mean], [position], color=colour[point.number], zorder=3)
    ax.set_yticks(range(len(points)), [p.name for p in points], fontsize="x-small")
    ax.invert_yaxis()
    ax.set(xlabel=f"final {metric}", title=f"final {metric} (evaluated once per run)")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _smooth(values: list[float]) -> list[float]:
    smoothed, average = [], None
    for value in values:
        if math.isfinite(value):
            average = value if average is None else SMOOTHING * average + (1 - SMOOTHING) * value
        smoothed.append(math.nan if average is None else average)
    return smoothed


def _short(label: str, width: int = 36) -> str:
    """A sweep point's values only ("ue4m3/16/floor"), cut to `width`."""
    pairs = label.split(",")
    if all("=" in pair for pair in pairs):
        label = "/".join(pair.partition("=")[2] for pair in pairs)
    return label if len(label) <= width else label[: width - 1] + "…"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
