"""`fp4 report`: chosen runs against BF16 and a baseline recipe, estimated cost, Pareto front."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

Opt = typer.Option


def report(
    runs: Annotated[
        list[str] | None, typer.Argument(help="Run ids or unique prefixes.", show_default=False)
    ] = None,
    sweep: Annotated[str | None, Opt(help="Every run of this sweep (name or id).")] = None,
    tag: Annotated[str | None, Opt(help="Every run with this tag.")] = None,
    task: Annotated[str | None, Opt(help="Only runs of this task.")] = None,
    metric: Annotated[
        str | None, Opt(help="Compare on this metric (default: the task's: val_loss, top1...).")
    ] = None,
    baseline: Annotated[
        str | None,
        Opt(
            help="The recipe whose gap the closed share divides (default: the sweep file's "
            "baseline, else mxfp4), e.g. tseng-baseline, tetrajet-baseline, wang-direct.",
            show_default=False,
        ),
    ] = None,
    target: Annotated[
        str, Opt(help="Device profile of the cost model: h100, h200, b200, a100...")
    ] = "h100",
    measured: Annotated[
        bool, Opt(help="Use the store's fp4 bench quantize rates of the target GPU, if any.")
    ] = True,
    top: Annotated[int, Opt(min=0, help="Show the best N rows (0: all); exports have all.")] = 30,
    plots: Annotated[
        Path | None, Opt(help="Write pareto.png and curves.png into this folder.")
    ] = None,
    csv: Annotated[Path | None, Opt(help="Write every row to this CSV file.")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print every row as JSON instead.")] = False,
    store: Annotated[
        Path | None,
        Opt(help="The run store (default: $FP4_STORE, else runs/fp4.db).", show_default=False),
    ] = None,
) -> None:
    """Final metrics of chosen runs (named, a sweep, a tag, or all), the gap to the BF16 run of
    the same task, size, steps, batch and seed, the share of a baseline recipe's gap each
    recipe closes (naive MXFP4's unless --baseline), the cost model's estimated time against
    BF16, and the Pareto front of gap vs cost."""
    from fp4cli.analysis.report import build_report, select_runs, sweep_baseline
    from fp4cli.cli.output import output_file, output_folder
    from fp4cli.store import RunStore

    output_folder(plots, "--plots")
    output_file(csv, "--csv")
    with RunStore(store, read_only=True) as run_store:
        chosen = select_runs(run_store, runs or (), sweep, tag, task)
        asked = baseline is not None  # a sweep's own baseline may still be training
        baseline = baseline or sweep_baseline(run_store, sweep)
        result = build_report(
            run_store, chosen, metric, target, measured, baseline, require_baseline=asked
        )
        written = _write_plots(run_store, result, plots) if plots is not None else []
    if csv is not None:
        written.append(_write_csv(result, csv))
    if as_json:
        from fp4cli.cli.output import echo_json

        echo_json(result.to_dict())
        return
    from fp4cli.cli.output import console_for

    table = _table(result, top)
    console = console_for(table)
    console.print(table)
    for note in result.notes + [f"wrote {path}" for path in written]:
        console.print(f"[dim]{note}[/]")


def _table(result: Any, top: int) -> Any:
    from rich.markup import escape
    from rich.table import Table

    rows = result.rows[:top] if top else result.rows
    shown = f", the best {len(rows)} shown" if len(rows) < len(result.rows) else ""
    tasks = sorted({row.task for row in result.rows})
    seeds = sorted({row.seed for row in result.rows})
    metrics = sorted({row.metric for row in result.rows})
    facts = [f"task {tasks[0]}"] if len(tasks) == 1 else []
    facts += [f"seed {seeds[0]}"] if len(seeds) == 1 else [f"seeds {', '.join(map(str, seeds))}"]
    facts += [metrics[0]] if len(metrics) == 1 else []
    table = Table(title=f"{len(result.rows)} runs{shown}: " + ", ".join(facts), box=None,
                  pad_edge=False)  # fmt: skip
    table.add_column("#", justify="right", no_wrap=True)
    # run ids are what a user types next: never cut; the labels wrap instead
    table.add_column("run", no_wrap=True, min_width=max(len(row.run_id) for row in rows))
    table.add_column("recipe / point", overflow="fold", min_width=8)
    if len(tasks) > 1:
        table.add_column("task")
    if len(seeds) > 1:
        table.add_column("seed", justify="right")
    for column in (metrics[0] if len(metrics) == 1 else "metric", "gap", "closed", "cost"):
        table.add_column(column, justify="right", no_wrap=True)
    noise = any(row.noise_ratio is not None for row in rows)  # runs with --stats-every
    if noise:
        for column in ("grad/noise", "< sqrt3 at"):
            table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        value = (
            _number(row.value, metric=row.metric)
            if row.status == "finished"
            else "[magenta]diverged[/]"
        )
        if len(metrics) > 1:
            value = f"{row.metric} {value}"
        cost = f"{row.cost_ratio:.2f}x" if row.cost_ratio is not None else "-"
        point = f"{row.point}[red]*[/]" if row.pareto else f"{row.point} "
        cells = [point, row.run_id, escape(row.label)]
        cells += [row.task] if len(tasks) > 1 else []
        cells += [str(row.seed)] if len(seeds) > 1 else []
        gap = _number(row.gap, signed=True, metric=row.metric)
        cells += [value, gap, _percent(row.closed), cost]
        cells += _noise_cells(row) if noise else []
        table.add_row(*cells)
    table.caption = (
        "#: the point's number in the figures (its seeds share it), * on the Pareto front of gap "
        "vs cost; "
        "gap: metric - bf16 (top1: bf16 - top1), positive is worse; closed: share of the "
        f"{result.baseline} gap closed; cost: estimated time of the linear layers / bf16 on "
        f"{result.target}"
    )
    if noise:
        table.caption += (
            "; grad/noise: the weight gradients' norm over their quantization noise's at the "
            "last statistics step; < sqrt3 at: the first statistics step where it fell below "
            "sqrt(3), FP4 All the Way's point to switch to higher precision"
        )
    return table


def _noise_cells(row: Any) -> list[str]:
    """The gradient-to-noise ratio and the step it first fell below sqrt(3) ("-": no such
    statistic in the run; "not reached": never below)."""
    if row.noise_ratio is None:
        return ["-", "-"]
    ratio = "inf" if math.isinf(row.noise_ratio) else f"{row.noise_ratio:.2f}"
    below = "not reached" if row.noise_below_step is None else str(row.noise_below_step)
    return [ratio, below]


def _write_plots(store: Any, result: Any, folder: Path) -> list[Path]:
    from fp4cli.analysis.report_plot import curves_png, pareto_png

    written = [curves_png(store, result, folder / "curves.png")]
    pareto = pareto_png(result, folder / "pareto.png")
    return written + ([pareto] if pareto is not None else [])


def _write_csv(result: Any, path: Path) -> Path:
    import csv as csv_module
    import dataclasses

    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f.name for f in dataclasses.fields(result.rows[0])]
    with path.open("w", newline="") as file:
        writer = csv_module.DictWriter(file, fieldnames=names)
        writer.writeheader()
        for row in result.rows:
            writer.writerow(dataclasses.asdict(row))
    return path


def _number(value: float | None, signed: bool = False, metric: str = "") -> str:
    """A metric or a gap with the metric's decimals: top-1 (a percentage) 2, losses 4; one
    table never mixes formats."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    decimals = 2 if metric == "top1" else 4
    return f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
