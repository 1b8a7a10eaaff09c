"""`fp4 runs`: list, show and delete the runs in the run store."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="List, inspect and delete the runs in the run store.", no_args_is_help=True)

StoreOption = Annotated[
    Path | None,
    typer.Option(
        "--store",
        help="The run store file (default: $FP4_STORE, else runs/fp4.db)",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (NaN and inf as null).")]
RunArgument = Annotated[str, typer.Argument(help="A run id, or a unique prefix of one.")]

PRIMARY_METRICS = ("val_loss", "eval_loss", "top1")  # the final numbers `runs list` shows
STATUS_STYLES = {
    "running": "yellow",
    "finished": "green",
    "failed": "red",
    "diverged": "magenta",
    "interrupted": "dim",
}


@app.command("list")
def list_command(
    status: Annotated[
        str | None,
        typer.Option(help="running, finished, failed, diverged or interrupted."),
    ] = None,
    task: Annotated[str | None, typer.Option(help="Only runs of this task.")] = None,
    recipe: Annotated[str | None, typer.Option(help="Only runs of this recipe.")] = None,
    sweep: Annotated[str | None, typer.Option(help="Only runs of this sweep (name or id).")] = None,
    tag: Annotated[str | None, typer.Option(help="Only runs with this tag.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many runs.")] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs, newest first, with their final val_loss / eval_loss / top1."""
    from fp4cli.store import RunStore

    with RunStore(store, read_only=True) as run_store:
        path = run_store.path
        sweep_id = run_store.get_sweep(sweep)["id"] if sweep is not None else None
        runs = run_store.list_runs(status, task, recipe, sweep_id, tag, limit)
        for run in runs:
            run["final_metrics"] = run_store.final_metrics(run["id"], PRIMARY_METRICS)
    if as_json:
        _echo_json(runs)
    elif not runs:
        filtered = any(f is not None for f in (status, task, recipe, sweep, tag))
        typer.echo(f"no runs in {path}" + (" match these filters" if filtered else ""))
    else:
        _print_runs(runs, path)


@app.command("show")
def show_command(run: RunArgument, store: StoreOption = None, as_json: JsonOption = False) -> None:
    """Show a run: its fields, resolved config, final metrics, checkpoints, last quant stats."""
    from fp4cli.store import RunStore

    with RunStore(store, read_only=True) as run_store:
        record = run_store.get_run(run)
        run_id = record["id"]
        record["final_metrics"] = run_store.final_metrics(run_id)
        record["checkpoints"] = _with_files(run_store.checkpoints(run_id), run_store.path, run_id)
        record["quant_stats"] = run_store.quant_stats_summary(run_id)
    if as_json:
        _echo_json(record)
    else:
        _print_run(record)


@app.command("delete")
def delete_command(
    run: RunArgument,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    store: StoreOption = None,
) -> None:
    """Delete a run and its metrics, quant stats and checkpoint records (not the files)."""
    from fp4cli.store import RunStore

    with RunStore(store, create=False) as run_store:
        record = run_store.get_run(run)
        if not yes:
            what = f"{record['id']} ({record['task']}, {record['recipe']}, {record['status']})"
            typer.confirm(f"Delete run {what} and all its rows?", abort=True)
        run_store.delete_run(record["id"])
    typer.echo(f"deleted run {record['id']}")


@app.command("merge")
def merge_command(
    folder: Annotated[
        Path,
        typer.Argument(
            help="A sweep's folder (its shards/), or a folder of shard files.", show_default=False
        ),
    ],
    store: StoreOption = None,
) -> None:
    """Fold the finished shards of FOLDER (the store files that jobs on other machines write)
    into the store, one line per run. Merging again changes nothing; a shard still being
    written is left for later; a run the store holds is never replaced by an older or a
    different copy (a conflict: the store's copy is kept)."""
    from fp4cli.store import RunStore, StoreError
    from fp4cli.store.paths import is_folder
    from fp4cli.store.shards import merge_shards

    if not is_folder(folder):
        raise StoreError(f"no such folder {folder}")
    shards = folder / "shards" if is_folder(folder / "shards") else folder
    with RunStore(store) as run_store:
        result = merge_shards(run_store, shards)
        path = run_store.path
    for line in _merge_lines(result):
        typer.echo(line)
    typer.echo(_merge_summary(result, path))


@app.command("export")
def export_command(
    runs: Annotated[
        list[str], typer.Argument(help="Run ids or unique prefixes.", show_default=False)
    ],
    tensorboard: Annotated[
        Path,
        typer.Option(help="Write TensorBoard event files into DIR/<run id>.", show_default=False),
    ],
    store: StoreOption = None,
) -> None:
    """Write TensorBoard event files of runs already in the store: their metrics, quantization
    statistics (quant/LAYER/OPERAND/METRIC) and resolved config (as hyperparameters). An
    earlier export's event files in DIR/<run id> are replaced."""
    from fp4cli.cli.output import output_folder
    from fp4cli.store import RunStore
    from fp4cli.track.tensorboard import export_runs

    output_folder(tensorboard, "--tensorboard")
    with RunStore(store, read_only=True) as run_store:
        ids = [run_store.get_run(run)["id"] for run in runs]
        folders = export_runs(run_store, ids, tensorboard)
    for folder in folders:
        typer.echo(f"wrote {folder}")
    typer.echo(f"view them with: tensorboard --logdir {tensorboard}")


MERGE_LINES = {  # what merging did with a run of a shard: one line each
    "merged": "merged {run} from {file}",
    "merged before": "{run} from {file}: merged before",
    "already there": "{run} from {file}: already there (the same copy)",
    "left out": "left out {run} from {file}: its sweep point already has a run",
    "conflict": "skipped {run} from {file}, a conflict: {why} (the store's copy is kept)",
}


def _merge_lines(result: Any) -> list[str]:
    """One line per run of the shards, then one per file left unread."""
    lines = [
        MERGE_LINES[run.outcome].format(run=run.run_id, file=run.file, why=run.why)
        for run in result.runs
    ]
    if result.target is not None:
        lines.append(f"skipped {result.target}: it is the store merged into")
    for name, why in result.skipped:
        lines.append(f"skipped {name}: {why} (tried again next time)")
    return lines


def _merge_summary(result: Any, path: Path) -> str:
    counts = [f"merged {_plural(len(result.merged), 'run')} into {path}",
              f"{len(result.already)} merged before"]  # fmt: skip
    if result.present:
        counts.append(f"{len(result.present)} already there")
    if result.duplicates:
        counts.append(f"{len(result.duplicates)} left out (their point already has a run)")
    if result.conflicts:
        counts.append(f"{_plural(len(result.conflicts), 'conflict')} (the store's copy kept)")
    return "; ".join(counts) + "."


def _with_files(checkpoints: list[dict[str, Any]], store: Path, run_id: str) -> list[Any]:
    """The checkpoints, each with `on_disk`: whether its file (or FSDP folder) is still there,
    looked for where it was written and in the store's checkpoints/<run id>/ folder."""
    folder = store.parent / "checkpoints" / run_id
    for checkpoint in checkpoints:
        path = Path(checkpoint["path"])
        checkpoint["on_disk"] = _exists(path) or _exists(folder / path.name)
    return checkpoints


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name the system refuses: no such file here
        return False


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _print_runs(runs: list[dict[str, Any]], path: Path) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    metrics = [m for m in PRIMARY_METRICS if any(m in run["final_metrics"] for run in runs)]
    console = Console()
    if not console.is_terminal:  # into a pipe or a file: tab-separated, nothing cut
        _print_tsv(runs, metrics)
        return
    rows = [_row_cells(run, metrics) for run in runs]
    header = ["id", "task", "recipe", "seed", "status", "step", *metrics, "started (UTC)",
              "duration"]  # fmt: skip
    shown = _fitting_columns(header, rows, console.width)
    table = Table(title=f"runs in {path}", box=box.SIMPLE_HEAD)
    for index in shown:  # ids and statuses are never cut: other columns give way, or go
        name = header[index]
        whole = name in ("id", "status")
        table.add_column(
            name,
            justify="right" if name in ("seed", "step", *metrics, "duration") else "left",
            no_wrap=whole,
            min_width=max(len(row[index]) for row in rows) if whole else None,
        )
    for run, row in zip(runs, rows, strict=True):
        cells = [
            Text(row[i], style=STATUS_STYLES[run["status"]])
            if header[i] == "status"
            else Text(row[i])
            for i in shown
        ]  # fmt: skip  (Text: no markup in names)
        table.add_row(*cells)
    console.print(table)


DROPPED_FIRST = ("duration", "started (UTC)", "seed", "step", "task")  # when the table is too wide


def _row_cells(run: dict[str, Any], metrics: list[str]) -> list[str]:
    finals = [_metric(m, run["final_metrics"].get(m)) for m in metrics]
    started = run["started_at"][:16].replace("T", " ")
    cells = [run["id"], run["task"], run["recipe"], run["seed"], run["status"], run["step"]]
    return [*map(_text, cells), *finals, started, _duration(run)]


def _fitting_columns(header: list[str], rows: list[list[str]], width: int) -> list[int]:
    """The indexes of the columns to show: all that fit in `width`, dropping DROPPED_FIRST in
    order until the rest do (ids, recipes, statuses and metrics always stay)."""
    widths = [max(len(name), *(len(row[i]) for row in rows)) + 3 for i, name in enumerate(header)]
    shown = list(range(len(header)))
    for name in DROPPED_FIRST:
        if sum(widths[i] for i in shown) + 2 <= width:
            break
        shown.remove(header.index(name))
    return shown


def _print_tsv(runs: list[dict[str, Any]], metrics: list[str]) -> None:
    header = ["id", "task", "recipe", "seed", "status", "step", *metrics, "started", "duration"]
    typer.echo("\t".join(header))
    for run in runs:
        finals = [_metric(m, run["final_metrics"].get(m)) for m in metrics]
        cells = [run["id"], run["task"], run["recipe"], run["seed"], run["status"], run["step"]]
        row = [*map(_text, cells), *finals, run["started_at"], _duration(run)]
        typer.echo("\t".join(cell.replace("\t", " ") for cell in row))


def _print_run(run: dict[str, Any]) -> None:
    import yaml
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False)
    status = Text(run["status"], style=STATUS_STYLES[run["status"]])
    console.print(Text.assemble((f"run {run['id']}", "bold"), "  ", status))
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="dim")
    fields.add_column()
    skip = {"id", "status", "config", "versions", "torch_version", "triton_version"}
    skip |= {"final_metrics", "checkpoints", "quant_stats"}
    for key, value in run.items():
        if key not in skip:
            fields.add_row(key, Text(_text(", ".join(value) if key == "tags" else value)))
    fields.add_row("duration", _duration(run))
    versions = " ".join(f"{k} {v}" for k, v in run["versions"].items())
    fields.add_row("versions", Text(_text(versions)))
    console.print(fields)

    console.rule("resolved config", style="dim")
    console.print(yaml.safe_dump(run["config"], sort_keys=False).rstrip(), markup=False)
    if run["final_metrics"]:
        table = Table("metric", "final value", box=box.SIMPLE_HEAD, title="final metrics")
        for name, value in run["final_metrics"].items():
            table.add_row(Text(name), _number(value))
        console.print(table)
    on_disk = [c for c in run["checkpoints"] if c["on_disk"]]
    if on_disk:
        table = Table("step", "path", "created (UTC)", box=box.SIMPLE_HEAD, title="checkpoints")
        for checkpoint in on_disk:
            row = (str(checkpoint["step"]), checkpoint["path"], checkpoint["created_at"])
            table.add_row(*map(Text, row))
        console.print(table)
    removed = [c for c in run["checkpoints"] if not c["on_disk"]]
    if removed:
        console.print(Text(_removed_line(removed), style="dim"))
    stats = run["quant_stats"]
    if stats is not None:
        table = Table(
            "operand", "metric", "layers", "mean", "min", "max",
            box=box.SIMPLE_HEAD, title=f"quant stats at step {stats['step']} (over layers)",
        )  # fmt: skip
        for row in stats["rows"]:
            numbers = [_number(row[key]) for key in ("mean", "min", "max")]
            names = (row["operand"], row["metric"], str(row["layers"]))
            table.add_row(*map(Text, names), *numbers)
        console.print(table)


def _removed_line(removed: list[dict[str, Any]]) -> str:
    """One line for the checkpoints whose files are gone (pruned, moved or deleted)."""
    steps = sorted({c["step"] for c in removed})
    where = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} to {steps[-1]}"
    return f"{_plural(len(removed), 'checkpoint')} no longer on disk ({where})"


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _metric(name: str, value: float | None) -> str:
    """A final metric as the tables show it: top-1 as a percentage, losses to 4 decimals."""
    if value is None:
        return "-"
    return f"{value:.2f}%" if name == "top1" else f"{value:.4f}"


def _duration(run: dict[str, Any]) -> str:
    """Started to ended (to now, for a run still running)."""
    start = datetime.fromisoformat(run["started_at"])
    end = datetime.fromisoformat(run["ended_at"]) if run["ended_at"] else None
    if end is None and run["status"] != "running":
        return "-"
    seconds = int(((end or datetime.now(timezone.utc)) - start).total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _echo_json(data: Any) -> None:
    from fp4cli.cli.output import echo_json

    echo_json(data)
