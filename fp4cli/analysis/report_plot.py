"""`fp4 report`'s figures: the Pareto plane (gap vs estimated cost) and curves against BF16."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fp4cli.analysis.plots import new_figure, save_png
from fp4cli.analysis.report import Report, ReportRow

CURVE_RUNS = 8  # besides the baselines, the best runs by gap get a curve
SMOOTHING = 0.9  # exponential moving average of the train loss


def pareto_png(report: Report, path: str | Path) -> Path | None:
    """Every run with a gap and a cost as a point, the front joined; None if there is none."""
    rows = [r for r in report.rows if _finite(r.gap) and _finite(r.cost_ratio)]
    if not rows:
        return None
    figure, (ax,) = new_figure(width=7.5, height=5.0)
    ax.scatter([r.cost_ratio for r in rows], [r.gap for r in rows], s=14, c="0.6", label="runs")
    front = sorted((r for r in rows if r.pareto), key=lambda r: r.cost_ratio or 0.0)
    ax.plot(
        [r.cost_ratio for r in front], [r.gap for r in front], "o-", c="tab:red", ms=5,
        label="Pareto front",
    )  # fmt: skip
    for row in front:
        ax.annotate(_short(row.label), (row.cost_ratio, row.gap), fontsize=6, xytext=(4, 3),
                    textcoords="offset points")  # fmt: skip
    for row in rows:
        if row.recipe in ("bf16", "mxfp4"):
            ax.scatter([row.cost_ratio], [row.gap], s=60, marker="*", zorder=3, label=row.recipe)
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xlabel(f"estimated time of the linear layers / BF16 ({report.target})")
    ax.set_ylabel(f"gap to BF16 ({rows[0].metric}; lower is better)")
    ax.set_title("accuracy gap vs estimated cost", fontsize="medium")
    ax.legend(fontsize="x-small", title=_axes_title(front), title_fontsize="x-small")
    return save_png(figure, path)


def curves_png(store: Any, report: Report, path: str | Path) -> Path:
    """The train loss (smoothed) and the primary metric over steps: the baselines in black and
    grey, the best runs by gap in colour."""
    figure, (loss_ax, metric_ax) = new_figure(1, 2, width=6.0, height=4.2)
    for row, style in _curve_runs(report):
        train = store.metrics(row.run_id, "train_loss")
        loss_ax.plot([m["step"] for m in train], _smooth([m["value"] for m in train]), **style)
        metric = store.metrics(row.run_id, row.metric)
        metric_ax.plot(
            [m["step"] for m in metric], [m["value"] for m in metric], "o-", ms=3, **style
        )
    loss_ax.set(xlabel="step", ylabel="train loss (smoothed)", yscale="log")
    metric_ax.set(xlabel="step", ylabel=report.rows[0].metric if report.rows else "metric")
    loss_ax.legend(fontsize="x-small", title=_axes_title(report.rows), title_fontsize="x-small")
    return save_png(figure, path)


def _curve_runs(report: Report) -> list[tuple[ReportRow, dict[str, Any]]]:
    chosen: list[tuple[ReportRow, dict[str, Any]]] = []
    seen_baselines: set[str] = set()
    for row in report.rows:
        if row.recipe in ("bf16", "mxfp4") and row.recipe not in seen_baselines:
            seen_baselines.add(row.recipe)
            color = "black" if row.recipe == "bf16" else "0.55"
            chosen.append((row, {"color": color, "lw": 2.0, "label": row.recipe}))
    others = [r for r in report.rows if r.recipe not in ("bf16", "mxfp4")][:CURVE_RUNS]
    chosen += [(row, {"lw": 1.0, "label": _short(row.label)}) for row in others]
    return chosen


def _smooth(values: list[float]) -> list[float]:
    smoothed, average = [], None
    for value in values:
        if math.isfinite(value):
            average = value if average is None else SMOOTHING * average + (1 - SMOOTHING) * value
        smoothed.append(math.nan if average is None else average)
    return smoothed


def _short(label: str, width: int = 40) -> str:
    """A sweep point's values only ("ue4m3/16/floor"; the axes are in the legend's title)."""
    pairs = label.split(",")
    if all("=" in pair for pair in pairs):
        label = "/".join(pair.partition("=")[2] for pair in pairs)
    return label if len(label) <= width else label[: width - 1] + "…"


def _axes_title(rows: list[ReportRow]) -> str | None:
    """ "scale/block/rule" when the labels are a sweep's name=value points."""
    for row in rows:
        pairs = row.label.split(",")
        if all("=" in pair for pair in pairs):
            return "/".join(pair.partition("=")[0] for pair in pairs)
    return None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
