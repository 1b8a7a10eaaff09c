"""The oscillation figure: osc_share, rate_qw and rate_out over training steps (the mean over
layers, thin lines per layer) and the confidence histogram at the last statistics step; one
colour per run, so two runs overlay."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp4cli.analysis.oscillation import (
    CONF_HIST,
    RunOscillation,
    histogram,
    layer_mean_by_step,
    summarize,
)
from fp4cli.analysis.plots import new_figure, save_png

CURVES = (  # metric, title, y label
    ("osc_share", "share of oscillating weights", "share with dist_Q / dist_W > 16"),
    ("rate_qw", "rate of change of Q(W)", "||Q_t - Q_t-1|| / ||Q_t-1||"),
    ("rate_out", "rate of change of the output", "||P (Q_t - Q_t-1)^T|| / ||P Q_t-1^T||"),
)


def plot_oscillation(runs: Sequence[RunOscillation], path: str | Path) -> Path:
    """Write the figure of one or two runs to `path` (PNG); returns the path written."""
    figure, axes = new_figure(2, 2)
    for index, run in enumerate(runs):
        colour = f"C{index}"
        for ax, (metric, title, ylabel) in zip(axes, CURVES, strict=False):
            _curves(ax, run, metric, colour)
            ax.set(title=title, xlabel="step", ylabel=ylabel)
        _histogram(axes[3], run, colour, index, len(runs))
    axes[3].set_ylim(0, axes[3].get_ylim()[1] * 1.3)  # room for the legend above the bars
    axes[0].legend(fontsize="small")
    axes[3].legend(fontsize="small")
    return save_png(figure, path)


def _curves(ax: Any, run: RunOscillation, metric: str, colour: str) -> None:
    """Thin per-layer lines and the mean over layers of `metric` against the step."""
    for series in run.layers.values():
        by_step = series.get(metric, {})
        steps = sorted(by_step)
        ax.plot(steps, [by_step[s] for s in steps], color=colour, linewidth=0.6, alpha=0.35)
    steps, means = layer_mean_by_step(run, metric)
    ax.plot(steps, means, color=colour, linewidth=2.0, marker=".", label=run.label)


def _histogram(ax: Any, run: RunOscillation, colour: str, index: int, count: int) -> None:
    """The confidence distribution (mean over layers) at the run's last statistics step."""
    summary = summarize(run, "last")
    shares = [100 * (s or 0.0) for s in histogram(summary.overall)]
    width = 0.1 / count
    lefts = [i / len(CONF_HIST) + index * width for i in range(len(CONF_HIST))]
    ax.bar(lefts, shares, width=width, align="edge", color=colour, label=run.label)
    ax.set(title="quantization confidence at the last statistics step", xlim=(0, 1))
    ax.set(xlabel="confidence (mean over layers)", ylabel="% of weights")
