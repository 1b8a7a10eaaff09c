"""Plot helpers shared by the analysis commands: matplotlib without a display, PNG files.

matplotlib is imported when a plot is made, not when a command module is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def new_figure(rows: int = 1, cols: int = 1, width: float = 6.4, height: float = 4.2) -> Any:
    """(figure, axes) on the Agg backend; axes is a flat list of rows * cols Axes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    return figure, [ax for row in axes for ax in row]


def save_png(figure: Any, path: str | Path) -> Path:
    """Write `figure` as a PNG (creating the folder), close it and return the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix.lower() != ".png":
        path = path.with_suffix(path.suffix + ".png") if path.suffix else path.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def stacked_count_panels(
    panels: Mapping[str, Mapping[str, Mapping[int, int]]],
    path: str | Path,
    xlabel: str,
    ylabel: str = "count",
    cols: int = 4,
) -> Path:
    """A PNG of count histograms over integer bins, one panel per title: {title: {series:
    {bin: count}}}, the series stacked (with a legend when there are several), shared x axis."""
    bins = sorted({b for series in panels.values() for counts in series.values() for b in counts})
    cols = max(1, min(cols, len(panels)))
    rows = -(-len(panels) // cols)
    figure, axes = new_figure(rows, cols, width=4.2, height=3.2)
    for ax, (title, series) in zip(axes, panels.items(), strict=False):
        bottom = dict.fromkeys(bins, 0)
        for name, counts in series.items():
            heights = [counts.get(b, 0) for b in bins]
            ax.bar(bins, heights, width=0.9, bottom=[bottom[b] for b in bins], label=name)
            bottom = {b: bottom[b] + counts.get(b, 0) for b in bins}
        if not any(bottom.values()):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        elif len(series) > 1:
            ax.legend(fontsize="x-small")
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    return save_png(figure, path)
