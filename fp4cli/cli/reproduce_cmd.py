"""`fp4 reproduce NAME`: train a paper's study (resumably, as a sweep) and judge its claims."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fp4cli.cli.runs_cmd import JsonOption, StoreOption

Opt = typer.Option


def reproduce(
    name: Annotated[
        str | None,
        typer.Argument(
            help="A study: wang, tetrajet, tseng, hu or sr-bits (fp4 reproduce --list), or a study "
            "file.",
            show_default=False,
        ),
    ] = None,
    list_: Annotated[bool, Opt("--list", help="List the shipped studies and exit.")] = False,
    task: Annotated[str | None, Opt(help="Train this task instead of the study's.")] = None,
    size: Annotated[str | None, Opt(help="Model size instead of the study's (e.g. debug).")] = None,
    steps: Annotated[int | None, Opt(min=1, help="Training steps instead of the study's.")] = None,
    seeds: Annotated[
        str | None, Opt(help="Seeds instead of the study's, comma-separated (e.g. 0,1,2).")
    ] = None,
    data: Annotated[
        Path | None,
        Opt(
            help="Data for the task: CIFAR-10 or an ImageFolder for vit; text, a token folder"
            " or python-sources for gpt and llama."
        ),
    ] = None,
    device: Annotated[
        str | None, Opt(help="Train every run on this device (cpu, cuda:1) (default: spread).")
    ] = None,
    cuda_graph: Annotated[
        bool | None,
        Opt(
            "--cuda-graph/--no-cuda-graph",
            help="Replay training steps from a CUDA graph (the same numbers, faster) (default: "
            "on a CUDA GPU wherever a run allows it).",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int | None,
        Opt(min=1, help="Worker processes (default: one per GPU; up to 8 per GPU for regression)."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        Opt(
            "--set",
            help="KEY=VALUE for a training field of every run (stats_every=50, "
            "model.n_layer=4); the recipes stay the paper's (repeatable).",
        ),
    ] = None,
    dry_run: Annotated[
        bool, Opt("--dry-run", help="List the runs, what is done and the claims; train nothing.")
    ] = False,
    plots: Annotated[
        Path | None, Opt(help="Write curves.png (and weights.png, pareto.png) into this folder.")
    ] = None,
    target: Annotated[
        str, Opt(help="Device profile of the cost model (Pareto claims): h100, b200...")
    ] = "h100",
    store: StoreOption = None,
    quiet: Annotated[bool, Opt(help="No progress bar.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Reproduce a paper's claims: train its study (the recipes it compares and their baselines,
    over several seeds, as a sweep: run it again after a kill and it resumes), then print a
    table per claim (mean +- std over seeds, the paper's own numbers beside them) and a verdict
    by a paired one-sided t-test over seeds at alpha = 0.05: reproduced, not reproduced, or
    inconclusive (the seeds' spread is wider than the effect; always so on one seed)."""
    from fp4cli.analysis.study import Overrides, load_study, study_spec
    from fp4cli.cli.output import output_folder

    if list_:
        _print_list()
        return
    if name is None:
        raise typer.BadParameter(
            "name a study (fp4 reproduce --list shows them)", param_hint="NAME"
        )
    output_folder(plots, "--plots")
    study = load_study(name)
    train = _training_fields(set_ or [])
    overrides = Overrides(
        task, size, steps, _seeds(seeds), _data(data), _on_cpu(device), cuda_graph, train
    )
    spec = study_spec(study, overrides)
    if overrides.suffix():  # a dry run too: it should show what a run would refuse
        _check_task(spec)
    _run_and_judge(study, spec, device, workers, dry_run, plots, target, store, quiet, as_json)


def _run_and_judge(
    study: Any,
    spec: Any,
    device: str | None,
    workers: int | None,
    dry_run: bool,
    plots: Path | None,
    target: str,
    store: Path | None,
    quiet: bool,
    as_json: bool,
) -> None:
    from rich.console import Console

    from fp4cli.analysis.reproduce import StudyData, evaluate
    from fp4cli.cli import reproduce_view as view
    from fp4cli.store import RunStore
    from fp4cli.sweep import plan_sweep

    console = Console(highlight=False, stderr=as_json)
    with RunStore(store) as run_store:
        plan = plan_sweep(spec, run_store, record=not dry_run)
        if dry_run:
            view.print_plan(study, plan)
            return
        console.print(view.plan_line(plan))
        if plan.pending:
            failed = _train(plan, run_store, workers, device, quiet, console)
        else:  # nothing to train: give up the claim on the sweep at once
            failed = 0
            run_store.release_sweep(plan.sweep_id)
        plan = plan_sweep(spec, run_store, record=False)
        data = StudyData(run_store, spec, plan, target, measured=True)
        results = evaluate(study, data)
        written = []
        if plots is not None:
            from fp4cli.analysis.reproduce_plot import plot_study

            written = plot_study(data, results, spec.baseline, plots)
    if as_json:
        from fp4cli.cli.output import echo_json

        echo_json(view.to_json(study, spec, plan, results, run_store.path))
    else:
        view.print_results(study, spec, plan, results, run_store.path, written)
    if failed:
        raise typer.Exit(1)


def _train(
    plan: Any, store: Any, workers: int | None, device: str | None, quiet: bool, console: Any
) -> int:
    """Run the plan's pending points; the number that failed. A stop ends the command."""
    from rich.markup import escape

    from fp4cli.cli.sweep_cmd import _RichReporter
    from fp4cli.sweep import run_sweep
    from fp4cli.sweep.errors import SweepStopped
    from fp4cli.sweep.runner import SilentSweepReporter

    reporter = SilentSweepReporter() if quiet else _RichReporter(console)
    try:
        results = run_sweep(plan, store, workers, device, reporter)
    except (KeyboardInterrupt, SweepStopped):
        console.print(
            f"[yellow]study {plan.spec.name} stopped[/]; finished runs are in "
            f"{store.path}. Run the same command again to resume."
        )
        raise typer.Exit(130) from None
    failed = [r for r in results if r.status == "failed"]
    for result in failed:
        console.print(
            f"[red]failed[/] {escape(result.label)} seed {result.seed}: {escape(result.message)}"
        )
    return len(failed)


def _print_list() -> None:
    from fp4cli.analysis.study import load_study, study_names
    from fp4cli.cli import reproduce_view as view

    view.print_list([load_study(name) for name in study_names()])


def _check_task(spec: Any) -> None:
    """Build the task once on the CPU, so that a size, data path or model field it cannot take
    is one error now, not a failure of every run."""
    from fp4cli.tasks.base import create_task

    train = dict(spec.train)
    size, data = train.get("size", "default"), train.get("data")
    create_task(spec.tasks[0], size, data, "cpu", train.get("model"))


def _training_fields(items: list[str]) -> tuple[tuple[str, Any], ...]:
    """(field, value) pairs of `--set` training fields; a recipe key is refused."""
    from fp4cli.train.config import ConfigError, split_overrides

    values, recipe_keys = split_overrides(items)
    if recipe_keys:
        raise ConfigError(
            f"--set {recipe_keys[0]}: a study trains the paper's recipes; set training fields "
            "here (lr=, stats_every=, model.FIELD=) or change the recipes in a study file"
        )
    reserved = sorted(set(values) & {"task", "recipe", "seed", "tags", "sweep", "name"})
    if reserved:
        raise ConfigError(f"--set {reserved[0]}: set by the study itself")
    return tuple(sorted(values.items()))


def _seeds(text: str | None) -> tuple[int, ...] | None:
    from fp4cli.analysis.errors import AnalysisError

    if text is None:
        return None
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise AnalysisError(
            f"--seeds: must be integers separated by commas (got {text!r})"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise AnalysisError(f"--seeds: must be distinct integers from 0 (got {text!r})")
    return seeds


def _data(path: Path | None) -> str | None:
    """The --data of every run: a named corpus as it is, a path made absolute."""
    from fp4cli.analysis.errors import AnalysisError
    from fp4cli.tasks.corpus import PYTHON_SOURCES

    if path is None:
        return None
    if str(path) == PYTHON_SOURCES:
        return PYTHON_SOURCES
    resolved = path.expanduser().resolve()
    if not resolved.exists():
        raise AnalysisError(f"--data: {resolved} does not exist")
    return str(resolved)


def _on_cpu(device: str | None) -> bool:
    """Whether the runs train on a CPU (no CUDA graphs there)."""
    if device is not None and device != "auto":
        return device.startswith("cpu")
    import torch

    return not torch.cuda.is_available()
