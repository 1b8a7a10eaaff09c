"""Weight oscillation of a run, from the statistics `fp4 train --stats-every N` stored.

The trainer writes, per quantized weight and statistics step, rows (layer, "weight", metric,
value) with the metrics of fp4cli.train.stats: osc_share, osc_ratio_mean, rate_w, rate_qw,
rate_out, conf_mean, conf_low and conf_hist_0 .. conf_hist_9. Here they become per-layer series
(metric -> step -> value) and summaries: each layer's value at the last statistics step or its
mean over all statistics steps, and the mean over layers. Pure Python: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fp4cli.analysis.errors import AnalysisError

METRICS = (
    "osc_share",
    "osc_ratio_mean",
    "rate_w",
    "rate_qw",
    "rate_out",
    "conf_mean",
    "conf_low",
)
CONF_HIST = tuple(f"conf_hist_{i}" for i in range(10))
AT = ("last", "mean")
BAR_BLOCKS = " ▁▂▃▄▅▆▇█"

Series = dict[str, dict[int, float]]  # metric -> step -> value
Values = dict[str, float | None]  # metric -> value (None: not recorded)


@dataclass(frozen=True)
class RunOscillation:
    """The weight statistics of one run: layer -> metric -> step -> value."""

    run_id: str
    recipe: str
    task: str
    layers: dict[str, Series]

    @property
    def steps(self) -> list[int]:
        """Every statistics step of the run, ascending."""
        return sorted({s for series in self.layers.values() for v in series.values() for s in v})

    @property
    def label(self) -> str:
        return f"{self.run_id} ({self.recipe})"


@dataclass(frozen=True)
class Summary:
    """Per-layer values (at the last step, or the mean over steps) and their mean over layers."""

    at: str
    step: int  # the run's last statistics step
    layers: dict[str, Values]
    overall: Values


def weight_series(rows: Iterable[Mapping[str, Any]]) -> dict[str, Series]:
    """Store rows {step, layer, operand, metric, value} -> layer -> metric -> step -> value,
    keeping the oscillation metrics of operand "weight"; layers in first-seen order."""
    wanted = set(METRICS + CONF_HIST)
    layers: dict[str, Series] = {}
    for row in rows:
        if row["operand"] == "weight" and row["metric"] in wanted:
            series = layers.setdefault(row["layer"], {})
            series.setdefault(row["metric"], {})[int(row["step"])] = float(row["value"])
    return layers


def load_oscillation(store: Any, run: str) -> RunOscillation:
    """The oscillation statistics of `run` (an id or a unique prefix) in a RunStore."""
    record = store.get_run(run)
    layers = weight_series(store.quant_stats(record["id"], operand="weight"))
    if not any(metric in series for series in layers.values() for metric in METRICS):
        raise AnalysisError(
            f"run {record['id']} has no oscillation statistics: train with --stats-every N "
            "and a recipe that quantizes weights"
        )
    return RunOscillation(record["id"], record["recipe"], record["task"], layers)


def layer_value(series: Series, metric: str, at: str, last_step: int) -> float | None:
    """A layer's `metric` at `last_step` (at="last") or its mean over steps (at="mean")."""
    by_step = series.get(metric, {})
    if at == "last":
        return by_step.get(last_step)
    if at == "mean":
        return mean(by_step.values())
    raise AnalysisError(f"unknown --at {at!r}: one of {', '.join(AT)}")


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None; None if there are none."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summarize(run: RunOscillation, at: str) -> Summary:
    """Every metric and confidence bin per layer, and the mean over layers."""
    last_step = run.steps[-1]
    names = METRICS + CONF_HIST
    layers = {
        layer: {name: layer_value(series, name, at, last_step) for name in names}
        for layer, series in run.layers.items()
    }
    overall = {name: mean(values[name] for values in layers.values()) for name in names}
    return Summary(at, last_step, layers, overall)


def histogram(values: Values) -> list[float | None]:
    """The ten confidence-bin shares of a layer's (or the overall) values."""
    return [values[name] for name in CONF_HIST]


def layer_mean_by_step(run: RunOscillation, metric: str) -> tuple[list[int], list[float]]:
    """(steps, mean over layers of `metric` at each step), steps where some layer has it."""
    steps, means = [], []
    for step in run.steps:
        value = mean(series.get(metric, {}).get(step) for series in run.layers.values())
        if value is not None:
            steps.append(step)
            means.append(value)
    return steps, means


def matched_layers(runs: Sequence[RunOscillation]) -> list[str]:
    """The layer names of all runs, matched by name: the first run's order, then the others'."""
    names: dict[str, None] = {}
    for run in runs:
        names.update(dict.fromkeys(run.layers))
    return list(names)


def confidence_bar(shares: Sequence[float | None]) -> str:
    """One block character per bin, its height proportional to the bin's share of the largest."""
    present = [s for s in shares if s is not None and math.isfinite(s)]
    top = max(present, default=0.0)
    if top <= 0:
        return " " * len(shares)
    levels = len(BAR_BLOCKS) - 1
    chars = []
    for share in shares:
        if share is None or not math.isfinite(share) or share <= 0:
            chars.append(BAR_BLOCKS[0])
        else:
            chars.append(BAR_BLOCKS[max(1, round(share / top * levels))])
    return "".join(chars)


def to_json(runs: Sequence[RunOscillation]) -> dict[str, Any]:
    """Every number: per layer and step, and both summaries; NaN and inf as None."""
    return {"runs": [_run_json(run) for run in runs]}


def _run_json(run: RunOscillation) -> dict[str, Any]:
    layers = {
        layer: [
            {"step": step, **{m: v[step] for m, v in series.items() if step in v}}
            for step in run.steps
            if any(step in v for v in series.values())
        ]
        for layer, series in run.layers.items()
    }
    summaries = {}
    for at in AT:
        summary = summarize(run, at)
        summaries[at] = {"layers": summary.layers, "mean_over_layers": summary.overall}
    return {
        "run": run.run_id,
        "recipe": run.recipe,
        "task": run.task,
        "steps": run.steps,
        "last_step": run.steps[-1],
        "layers": layers,
        "summary": summaries,
    }
