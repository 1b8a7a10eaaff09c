"""`fp4 reproduce --plots`: the curves of a study's arms with their seeds as bands.

As `fp4 report`'s figures: one colour per arm in every figure (bf16 black, the study's baseline
red, the others from one palette in the order the claims name them), each arm the mean over its
seeds with their range as a band. curves.png: the train loss (smoothed) and the primary metric
over steps; weights.png, for claims on weight statistics: each such statistic (the mean over
layers) over steps; pareto.png, for a Pareto claim: `fp4 report`'s plane of the study's runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp4cli.analysis.plots import new_figure, save_png
from fp4cli.analysis.report_plot import BASELINE_COLOUR, BF16_COLOUR, PALETTE, _band

MAX_ARMS = 10  # arms with a curve: bf16, the baseline and those the claims name first


def plot_study(data: Any, results: Sequence[Any], baseline: str | None, folder: Path) -> list[Path]:
    """Write the study's figures into `folder`; the paths written."""
    arms = _arms(data, results, baseline)
    colour = _colours(arms, baseline)
    written = [_curves(data, arms, colour, folder / "curves.png")]
    stats = list(
        dict.fromkeys(
            r.metric
            for r in results
            if r.claim.kind in ("lower", "higher") and r.metric != data.metric
        )
    )
    if stats:
        written.append(_weights(data, arms, colour, stats, folder / "weights.png"))
    if any(r.claim.kind == "pareto" for r in results) and data.report is not None:
        from fp4cli.analysis.report_plot import pareto_png

        pareto = pareto_png(data.report, folder / "pareto.png")
        written += [pareto] if pareto is not None else []
    return written


def _arms(data: Any, results: Sequence[Any], baseline: str | None) -> list[str]:
    named = ["bf16", *([baseline] if baseline else [])]
    for result in results:
        named += [line.arm for line in result.lines]
    return [arm for arm in dict.fromkeys(named) if arm in data.arms][:MAX_ARMS]


def _colours(arms: Sequence[str], baseline: str | None) -> dict[str, str]:
    chosen, others = {}, 0
    for arm in arms:
        if arm == "bf16":
            chosen[arm] = BF16_COLOUR
        elif arm == baseline:
            chosen[arm] = BASELINE_COLOUR
        else:
            chosen[arm] = PALETTE[others % len(PALETTE)]
            others += 1
    return chosen


def _curves(data: Any, arms: Sequence[str], colour: dict[str, str], path: Path) -> Path:
    figure, (loss_ax, metric_ax) = new_figure(1, 2, width=6.2, height=4.4)
    evaluated = {}
    for arm in arms:
        train, evaluated[arm] = _by_step(data, arm, ("train_loss", data.metric))
        _band(loss_ax, train, colour[arm], arm, smooth=True, bold=arm == "bf16")
    if max((len(by_step) for by_step in evaluated.values()), default=0) > 1:
        for arm in arms:
            _band(metric_ax, evaluated[arm], colour[arm], arm, bold=arm == "bf16")
        metric_ax.set(xlabel="step", ylabel=data.metric, title=f"{data.metric} over steps")
    else:
        _finals(metric_ax, data, arms, colour)
    loss_ax.set(xlabel="step", ylabel="train loss (smoothed)", yscale="log", title="train loss")
    seeds = max((len(data.arms[a]) for a in arms), default=1)
    title = f"lines: the mean of {seeds} seeds; bands: their range" if seeds > 1 else None
    loss_ax.legend(fontsize="x-small", title=title, title_fontsize="x-small")
    return save_png(figure, path)


def _finals(ax: Any, data: Any, arms: Sequence[str], colour: dict[str, str]) -> None:
    """A metric evaluated once per run: each arm's seeds' mean, their range as a bar."""
    for position, arm in enumerate(arms):
        values = list(data.values(arm, data.metric).values())
        if not values:
            continue
        if len(values) > 1:
            ax.plot(
                [min(values), max(values)], [position, position], color=colour[arm], lw=2, alpha=0.4
            )
        ax.scatter([sum(values) / len(values)], [position], color=colour[arm], zorder=3)
    ax.set_yticks(range(len(arms)), list(arms), fontsize="x-small")
    ax.invert_yaxis()
    ax.set(xlabel=f"final {data.metric}", title=f"final {data.metric} (evaluated once per run)")


def _weights(
    data: Any, arms: Sequence[str], colour: dict[str, str], stats: Sequence[str], path: Path
) -> Path:
    from fp4cli.analysis.oscillation import RunOscillation, layer_mean_by_step, weight_series

    figure, axes = new_figure(1, len(stats), width=5.2, height=4.0)
    for arm in arms:
        per_stat: dict[str, dict[int, list[float]]] = {stat: {} for stat in stats}
        for row in data.arms[arm].values():
            layers = weight_series(data.store.quant_stats(row.run_id, operand="weight"))
            run = RunOscillation(row.run_id, arm, "", layers)
            for stat in stats:
                for step, value in zip(*layer_mean_by_step(run, stat), strict=True):
                    per_stat[stat].setdefault(step, []).append(value)
        for ax, stat in zip(axes, stats, strict=True):
            _band(ax, per_stat[stat], colour[arm], arm)
    for ax, stat in zip(axes, stats, strict=True):
        ax.set(xlabel="step", ylabel=f"{stat} (mean over layers)", title=stat)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    return save_png(figure, path)


def _by_step(data: Any, arm: str, metrics: Sequence[str]) -> list[dict[int, list[float]]]:
    """Per metric, step -> the values over the arm's seeds."""
    series: list[dict[int, list[float]]] = [{} for _ in metrics]
    for row in data.arms[arm].values():
        for by_step, name in zip(series, metrics, strict=True):
            for m in data.store.metrics(row.run_id, name):
                by_step.setdefault(m["step"], []).append(m["value"])
    return series
