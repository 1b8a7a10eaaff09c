"""`fp4 sweep`: run every point of a sweep file (recipes x tasks x seeds), resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

Opt = typer.Option


def sweep(
    file: Annotated[Path, typer.Argument(help="The sweep file (YAML).", show_default=False)],
    workers: Annotated[
        int | None,
        Opt(min=1, help="Worker processes (default: one per GPU; up to 8 per GPU for regression)."),
    ] = None,
    device: Annotated[
        str | None, Opt(help="Put every worker on this device (cpu, cuda:1) (default: spread).")
    ] = None,
    dry_run: Annotated[
        bool, Opt("--dry-run", help="List the points and what is done; train nothing.")
    ] = False,
    store: Annotated[
        Path | None,
        Opt(help="The run store (default: $FP4_STORE, else runs/fp4.db).", show_default=False),
    ] = None,
    quiet: Annotated[bool, Opt(help="No progress bar.")] = False,
    launcher: Annotated[
        str,
        Opt(
            help="local (worker processes here), slurm (a job per point or group, through "
            "submitit) or submitit-local (the slurm path as processes of this machine)."
        ),
    ] = "local",
    partition: Annotated[str | None, Opt(help="Slurm partition (or the file's slurm:).")] = None,
    account: Annotated[str | None, Opt(help="Slurm account to charge.")] = None,
    gpus_per_job: Annotated[int | None, Opt(min=0, help="GPUs of each job (default 1).")] = None,
    cpus_per_job: Annotated[int | None, Opt(min=1, help="CPUs of each job.")] = None,
    time_min: Annotated[
        int | None, Opt(min=1, help="Time limit of each job in minutes (default 60).")
    ] = None,
    points_per_job: Annotated[
        int | None, Opt(min=1, help="Points one job trains, one after another (default 1).")
    ] = None,
    max_running: Annotated[
        int | None, Opt(min=1, help="Jobs of the sweep's job array running at once.")
    ] = None,
    sbatch: Annotated[
        list[str] | None,
        Opt(help="Any other sbatch option as KEY=VALUE, e.g. constraint=h100 (repeatable)."),
    ] = None,
    sweep_dir: Annotated[
        Path | None,
        Opt(
            help="Folder of the jobs' shards and logs, on a filesystem the nodes share "
            "(default: sweeps/NAME beside the store).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Train every point of a sweep: a base recipe with axes over any recipe or training field
    (a grid or a random sample, less exclusions), times tasks and seeds, plus baseline recipes.
    Points finished in the store are skipped, so running it again after a kill resumes it.
    Each point is an ordinary run, in the sweep, tagged point:ID. See sweeps/ for examples.
    With --launcher slurm each job trains into a store file of its own under the sweep's
    folder, and this process folds the finished ones into the store (fp4 runs merge too)."""
    from rich.console import Console

    from fp4cli.cli.output import console_for
    from fp4cli.store import RunStore
    from fp4cli.sweep import SweepError, load_sweep, plan_sweep, run_sweep
    from fp4cli.sweep.errors import SweepStopped
    from fp4cli.sweep.launchers import LAUNCHERS, parse_sbatch_flags
    from fp4cli.sweep.runner import SilentSweepReporter

    if launcher not in LAUNCHERS:
        raise typer.BadParameter(f"must be one of {', '.join(LAUNCHERS)}", param_hint="--launcher")
    spec = load_sweep(file)
    given = {"--partition": partition, "--account": account, "--gpus-per-job": gpus_per_job,
             "--cpus-per-job": cpus_per_job, "--time-min": time_min,
             "--points-per-job": points_per_job, "--max-running": max_running,
             "--sbatch": sbatch, "--sweep-dir": sweep_dir}  # fmt: skip
    if launcher == "local" and any(value is not None for value in given.values()):
        flags = ", ".join(name for name, value in given.items() if value is not None)
        raise SweepError(f"{flags}: only with --launcher slurm or submitit-local")
    if launcher != "local" and (workers is not None or device is not None):
        raise SweepError("--workers and --device: only with --launcher local (a job's device "
                         "is its GPU: --gpus-per-job)")  # fmt: skip
    cluster = spec.cluster.updated(
        partition=partition, account=account, gpus_per_job=gpus_per_job,
        cpus_per_job=cpus_per_job, time_min=time_min, points_per_job=points_per_job,
        max_running=max_running,
        sbatch=(*spec.cluster.sbatch, *parse_sbatch_flags(sbatch)) if sbatch else None,
    )  # fmt: skip
    console = Console(highlight=False)
    with RunStore(store) as run_store:
        if launcher != "local" and not dry_run:  # what jobs finished meanwhile counts as done
            _merge_finished(run_store, spec.name, sweep_dir)
        plan = plan_sweep(spec, run_store, record=not dry_run)
        if dry_run:
            table = points_table(plan)
            console = console_for(table)
            console.print(table)
            console.print(_plan_line(plan))
            return
        console.print(_plan_line(plan))
        reporter = SilentSweepReporter() if quiet else _RichReporter(console)
        try:
            if launcher == "local":
                results = run_sweep(plan, run_store, workers, device, reporter)
            else:
                results = _run_remote(plan, run_store, launcher, cluster, sweep_dir, reporter)
        except (KeyboardInterrupt, SweepStopped):
            jobs = "" if launcher == "local" else " Its submitted jobs go on;"
            console.print(
                f"[yellow]sweep {spec.name} stopped[/]; finished points are in "
                f"{run_store.path}.{jobs} Run the same command again to resume."
            )
            raise typer.Exit(130) from None
    console.print(_summary(spec.name, results, run_store.path))
    if any(r.status == "failed" for r in results):
        raise typer.Exit(1)


def _merge_finished(store: Any, name: str, folder: Path | None) -> None:
    """Fold the shards of this store's sweep `name` that finished while no coordinator ran."""
    from fp4cli.store.shards import merge_shards
    from fp4cli.sweep.remote import sweep_folder

    known = [s["id"] for s in store.sweeps() if s["name"] == name]
    if known:
        merge_shards(store, (folder or sweep_folder(store.path, name)) / "shards", known[0])


def _run_remote(
    plan: Any, store: Any, launcher: str, cluster: Any, folder: Path | None, reporter: Any
) -> list[Any]:
    from fp4cli.sweep.remote import RemoteLaunch, run_remote, sweep_folder

    folder = folder.resolve() if folder is not None else sweep_folder(store.path, plan.spec.name)
    launch = RemoteLaunch(launcher, cluster, folder, plan.spec.log_to)
    reporter.message(f"jobs' shards and logs in {folder}")
    return run_remote(plan, store, launch, reporter)


def _plan_line(plan: Any) -> str:
    parts = [_count(len(plan.points), "point"), f"{len(plan.done)} done",
             f"{len(plan.pending)} to run"]  # fmt: skip
    if plan.elsewhere:
        parts.append(f"{len(plan.elsewhere)} running in another process")
    recorded = f" ({plan.sweep_id})" if plan.sweep_id != "(new)" else " (not yet in the store)"
    return f"Sweep {plan.spec.name}{recorded}: " + ", ".join(parts) + "."


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def points_table(plan: Any, label: str = "recipe", name_of: Any = None) -> Any:
    """A planned sweep's points (id, task, seed, `label`, state): done, running, to run.
    `name_of(point)` names a point (default: its recipe)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table("point", "task", "seed", label, "state", box=None, pad_edge=False)
    for point in plan.points:
        if point.id in plan.done:
            state = f"[green]done[/] {plan.done[point.id]}"
        elif point.id in plan.elsewhere:
            state = f"[yellow]running[/] {plan.elsewhere[point.id]}"
        else:
            state = "to run"
        name = name_of(point) if name_of is not None else point.recipe["name"]
        table.add_row(point.id, point.task, str(point.seed), escape(name), state)
    return table


def _summary(name: str, results: list[Any], store_path: Any) -> str:
    from rich.markup import escape

    if not results:
        return f"Sweep {name}: nothing to run. Compare its runs with: fp4 report --sweep {name}"
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    seconds = sum(r.seconds for r in results)
    if all(r.status == "failed" for r in results):
        where = "Every point failed; nothing new to compare."
    else:
        where = f"Stored in {store_path}; compare them with: fp4 report --sweep {name}"
    lines = [
        f"Sweep {name}: ran {_count(len(results), 'point')} ("
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        + f"), {seconds:.0f} s of training. {where}"
    ]
    for result in results:
        if result.status == "failed":
            lines.append(
                f"[red]failed[/] {escape(result.label)} ({result.task}): {escape(result.message)}"
            )
    return "\n".join(lines)


class _RichReporter:
    """One bar over the whole sweep: points done, failures, the last point's result."""

    def __init__(self, console: Any) -> None:
        from fp4cli.train.progress import progress_bar

        self.progress = progress_bar(console)
        self.failed = 0

    def start(self, total: int, done: int, description: str) -> None:
        self.progress.start()
        self.task = self.progress.add_task(description, total=total, completed=done)

    def point_done(self, result: Any) -> None:
        from rich.markup import escape

        if result.status == "failed":
            self.failed += 1
            self.progress.console.print(
                f"[red]failed[/] {escape(result.label)} ({result.task}): {escape(result.message)}"
            )
        elif result.status == "diverged":
            self.progress.console.print(f"[magenta]diverged[/] {escape(result.label)}")
        self.progress.update(self.task, advance=1)

    def message(self, text: str) -> None:
        from rich.markup import escape

        self.progress.console.print(f"[dim]{escape(text)}[/]")

    def finish(self) -> None:
        self.progress.stop()
