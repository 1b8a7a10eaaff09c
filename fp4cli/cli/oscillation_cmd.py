"""`fp4 oscillation-report`: TetraJet's weight-oscillation diagnosis of one run, or two side by
side, from the statistics `fp4 train --stats-every N` stored (fp4cli.analysis.oscillation)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from fp4cli.analysis.oscillation import (
    CONF_HIST,
    RunOscillation,
    Summary,
    Values,
    confidence_bar,
    histogram,
    matched_layers,
    summarize,
)
from fp4cli.cli.runs_cmd import JsonOption, StoreOption

COLUMNS = (  # metric, header, number format (% : a share shown as a percentage)
    ("osc_share", "osc\n%", "%"),
    ("osc_ratio_mean", "ratio\nmean", ".3g"),
    ("rate_w", "rate\nW", "#.2g"),
    ("rate_qw", "rate\nQ(W)", "#.2g"),
    ("rate_out", "rate\nout", "#.2g"),
    ("conf_mean", "conf\nmean", ".3f"),
    ("conf_low", "conf\n<0.1 %", "%"),
)
MAX_RUNS = 2


class At(str, Enum):
    last = "last"
    mean = "mean"


def oscillation_report(
    runs: Annotated[
        list[str],
        typer.Argument(
            metavar="RUN",
            help="A run id or unique prefix; a second one to compare side by side.",
        ),
    ],
    at: Annotated[
        At,
        typer.Option(
            help="Per layer: the value at the last statistics step, or the mean over all of them."
        ),
    ] = At.last,
    png: Annotated[
        Path | None,
        typer.Option(help="Also write a figure over training steps to this PNG file."),
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Weight oscillation per quantized layer: the share of oscillating weights, the rates of
    change of W, Q(W) and the output, and quantization confidence with its distribution."""
    from fp4cli.analysis.errors import AnalysisError
    from fp4cli.analysis.oscillation import load_oscillation, to_json
    from fp4cli.cli.output import output_file
    from fp4cli.store import RunStore

    if len(runs) > MAX_RUNS:
        raise AnalysisError(f"oscillation-report takes one or two runs, got {len(runs)}")
    output_file(png, "--png")
    with RunStore(store, read_only=True) as run_store:
        loaded = [load_oscillation(run_store, run) for run in runs]
    if png is not None:
        from fp4cli.analysis.oscillation_plot import plot_oscillation

        written = plot_oscillation(loaded, png)
    if as_json:
        from fp4cli.cli.output import echo_json

        echo_json(to_json(loaded))
        return
    _print_report(loaded, at.value)
    if png is not None:
        typer.echo(f"wrote {written}")


def _print_report(runs: list[RunOscillation], at: str) -> None:
    from fp4cli.cli.output import console_for

    summaries = [summarize(run, at) for run in runs]
    tables = [_layer_table(runs, summaries), _confidence_table(runs, summaries)]
    console = console_for(*tables)
    for table in tables:
        console.print(table)


def _layer_table(runs: list[RunOscillation], summaries: list[Summary]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    letters = "AB" if len(runs) == 2 else ""
    table = Table(
        box=box.SIMPLE_HEAD,
        title=_title(runs, summaries),
        caption=_caption(runs),
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("layer", no_wrap=True)
    for _, header, _ in COLUMNS:
        for letter in letters or " ":
            table.add_column(f"{header}\n{letter}".rstrip(), justify="right")
    if not letters:
        table.add_column("conf\n0→1")
    rows: list[tuple[str, list[Values | None]]] = [
        (name, [s.layers.get(name) for s in summaries]) for name in matched_layers(runs)
    ]
    rows.append(("mean over layers", [s.overall for s in summaries]))
    for index, (name, values) in enumerate(rows):
        cells = [
            _cell(None if v is None else v[metric], form)
            for metric, _, form in COLUMNS
            for v in values
        ]
        if not letters:
            cells.append(confidence_bar(histogram(values[0])) if values[0] else "")
        table.add_row(Text(name), *cells, end_section=index == len(rows) - 2)
    return table


def _confidence_table(runs: list[RunOscillation], summaries: list[Summary]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    where = _where(summaries)
    title = f"% of weights per quantization confidence bin, mean over layers, {where}"
    table = Table(box=box.SIMPLE_HEAD, title=title, collapse_padding=True, pad_edge=False)
    table.add_column("run", no_wrap=True)
    for i in range(len(CONF_HIST)):
        table.add_column(f"{i / 10:.1f}", justify="right")
    table.add_column("0→1")
    letters = "AB" if len(runs) == 2 else " "
    for letter, run, summary in zip(letters, runs, summaries, strict=True):
        shares = histogram(summary.overall)
        cells = [_cell(share, "%") for share in shares]
        table.add_row(Text(f"{letter} {run.recipe}".strip()), *cells, confidence_bar(shares))
    return table


def _title(runs: list[RunOscillation], summaries: list[Summary]) -> str:
    names = " vs ".join(f"{run.run_id} ({run.task}, {run.recipe})" for run in runs)
    return f"weight oscillation of {names}, {_where(summaries)}"


def _where(summaries: list[Summary]) -> str:
    """Which values: at the last statistics step, or the mean over all of them."""
    steps = sorted({s.step for s in summaries})
    if len(steps) == 1:
        last = f"step {steps[0]}"
    else:
        last = ", ".join(
            f"{letter} step {s.step}" for letter, s in zip("AB", summaries, strict=False)
        )
    if summaries[0].at == "last":
        return f"at the last statistics step ({last})"
    return f"mean over the statistics steps (up to {last})"


def _caption(runs: list[RunOscillation]) -> str:
    legend = "   ".join(f"{letter}: {run.label}" for letter, run in zip("AB", runs, strict=False))
    rule = "osc: share of weights with dist_Q/dist_W > 16; rate: mean over steps of ||dX|| / ||X||"
    return f"{legend}\n{rule}" if len(runs) == 2 else rule


def _cell(value: float | None, form: str) -> str:
    """A blank for a value not recorded (a layer missing from one run, an older run's metric)."""
    if value is None:
        return ""
    return f"{100 * value:.1f}" if form == "%" else f"{value:{form}}"
