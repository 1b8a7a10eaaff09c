"""The outlier part of `fp4 quantize-inspect`: its table, JSON and CSV fields
(fp4cli.analysis.outliers defines the statistics)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

CSV_COLUMNS = ("kurtosis", "row_ratio_max", "row_ratio_p99", "col_ratio_max", "col_ratio_p99",
               "one_value_blocks")  # fmt: skip
RATIO_COLUMNS = {
    "kurtosis": "kurtosis",
    "row_ratio_max": "row max/med",
    "row_ratio_p99": "row p99",
    "col_ratio_max": "col max/med",
    "col_ratio_p99": "col p99",
}
CAPTION = (
    "kurtosis: 3 for a Gaussian; row/col max/med: max |x| over median |x| of a row (a token) or "
    "a column (a channel), the largest and the 99th percentile; 1-value /N: share of N-value "
    "blocks along the last axis whose largest |x| is over twice the second largest"
)


def outlier_table(reports: list[Any], variants: list[Any]) -> Any:
    """Rows: tensors as they are (and under each, each Hadamard transform); columns: the
    statistics, the one-value share at every block size of the specs."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    transforms = list(dict.fromkeys(v.hadamard for v in variants))
    blocks = _block_sizes(reports)
    table = Table(box=box.SIMPLE_HEAD, title="outliers (clamping and Hadamard transforms act on "
                  "these)", caption=CAPTION)  # fmt: skip
    table.add_column("tensor", overflow="fold")
    for title in RATIO_COLUMNS.values():
        table.add_column(title, justify="right")
    for block in blocks:
        table.add_column(f"1-value /{block}", justify="right")
    for report in reports:
        for size in transforms:
            label = f"rht{size}" if size else "none"
            name = report.name + (" *" if report.high_precision else "")
            first = Text(name) if size is None else Text(f"  +rht{size}")
            table.add_row(first, *_cells(report.outliers.get(label), blocks))
    return table


def _block_sizes(reports: list[Any]) -> list[int]:
    sizes = {b for r in reports for s in r.outliers.values() if s for b in s.one_value_blocks}
    return sorted(sizes, reverse=True)


def _cells(stats: Any, blocks: list[int]) -> list[Any]:
    from rich.text import Text

    if stats is None:
        return [Text("n/a", style="dim")] * (len(RATIO_COLUMNS) + len(blocks))
    cells = [_number(getattr(stats, name), "{:.1f}") for name in RATIO_COLUMNS]
    shares = [stats.one_value_blocks.get(block, math.nan) for block in blocks]
    return cells + [_number(share, "{:.1%}") for share in shares]


def _number(value: float, pattern: str) -> Any:
    from rich.text import Text

    if value != value:  # NaN: nothing to measure, or a tensor that is not finite
        return Text("n/a", style="dim")
    return Text(pattern.format(value))


def outliers_json(report: Any) -> dict[str, Any]:
    """{transform: statistics (block sizes as string keys) or None}."""
    described: dict[str, Any] = {}
    for label, stats in report.outliers.items():
        if stats is None:
            described[label] = None
            continue
        fields = asdict(stats)
        fields["one_value_blocks"] = {str(b): s for b, s in stats.one_value_blocks.items()}
        described[label] = fields
    return described


def outlier_csv_fields(report: Any, variant: Any) -> list[Any]:
    """The statistics of the tensor the variant quantizes (rotated for a +rht variant), the
    one-value share at its block size; empty where they have no value."""
    from fp4cli.analysis.quant_inspect import block_size, transform_label

    stats = report.outliers.get(transform_label(variant.hadamard))
    if stats is None:
        return [""] * len(CSV_COLUMNS)
    share = stats.one_value_blocks.get(block_size(variant.spec, report.shape[-1]), math.nan)
    values = [*(getattr(stats, name) for name in RATIO_COLUMNS), share]
    return ["" if value != value else value for value in values]
