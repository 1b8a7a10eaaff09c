"""`fp4 bench step`: one training step per recipe, backend and mode, against BF16."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fp4cli.cli.bench_options import (
    BackendsOption,
    DeviceOption,
    GemmsOption,
    LayerGraphsOption,
    NoStoreOption,
    RecipesOption,
    StoreOption,
)

Opt = typer.Option

PARALLEL_NAMES = {"fsdp": "FSDP2", "ddp": "DDP"}
STEP_COLUMNS = ("task", "recipe", "backend", "mode", "ms/step", "x bf16", "peak GiB", "x bf16 mem",
                "saved GiB", "x bf16 saved")  # fmt: skip


def step_command(
    tasks: Annotated[str, Opt(help="Comma-separated: gpt, vit (or any task).")] = "gpt,vit",
    recipes: RecipesOption = "bf16,mxfp4,tetrajet,tetrajet-qema,tseng-rht-sr",
    backends: BackendsOption = "triton",
    gemm: GemmsOption = None,
    modes: Annotated[
        str, Opt(help="Comma-separated: eager, graph (CUDA graph), compile, compile-graph.")
    ] = "eager,graph",
    size: Annotated[
        str | None,
        Opt(help="Model size of every task (default: gpt2-small for gpt, deit-small for vit)."),
    ] = None,
    batch_size: Annotated[
        int | None, Opt(min=1, help="Batch size (default: 8 for gpt, 128 for vit).")
    ] = None,
    steps: Annotated[int, Opt(min=1, help="Steps per timed loop; the median of 3 loops.")] = 10,
    max_batch: Annotated[
        str | None,
        Opt(help="Also find the largest batch that fits for these recipes, e.g. bf16,mxfp4."),
    ] = None,
    max_batch_limit: Annotated[int, Opt(min=1, help="Stop the batch search here.")] = 1024,
    recompute: Annotated[
        str,
        Opt(
            help="off, on or off,on: FP4 recipes keep their layers' 4-bit operands and "
            "recompute the outputs GELU and attention save (fp4 train --recompute); also for "
            "--max-batch."
        ),
    ] = "off",
    nproc_per_node: Annotated[
        int,
        Opt(
            min=1,
            help="Spread each step over this many processes (GPUs) under torchrun, eagerly; "
            "rank 0 reports.",
        ),
    ] = 1,
    parallel: Annotated[
        str | None, Opt(help="With --nproc-per-node 2+: fsdp (FSDP2, default) or ddp.")
    ] = None,
    gather: Annotated[
        str | None,
        Opt(
            help="Under FSDP2: how FP4 recipes all-gather their quantized weights: packed, "
            "bf16 or packed,bf16 (default: both, side by side)."
        ),
    ] = None,
    layer_graphs: LayerGraphsOption = "off",
    interleave: Annotated[
        bool,
        Opt(
            "--interleave",
            help="Hold every case of a task and mode at once and alternate their timed loops, "
            "so that the host's drift falls on each alike (each case's memory at once; not with "
            "--layer-graphs).",
        ),
    ] = False,
    device: DeviceOption = "auto",
    store: StoreOption = None,
    no_store: NoStoreOption = False,
) -> None:
    """Training-step time, peak memory and saved activations of FP4 recipes as ratios to BF16,
    measured side by side: each task's model at a named size (GPT-2 small, DeiT-Small), forward,
    backward and optimizer, eager or from a CUDA graph, with or without torch.compile. With
    --nproc-per-node the steps run on several processes (DDP or FSDP2), and under FSDP2 each
    FP4 recipe all-gathers its weights in FP4 and in BF16. Each number also goes to the run
    store (kind `step`)."""
    from fp4cli.bench import distributed_step
    from fp4cli.bench import step as bench
    from fp4cli.bench.baseline import BACKENDS
    from fp4cli.bench.parsing import (
        check_kernel_backends,
        parse_choices,
        parse_gemms,
        split_list,
    )
    from fp4cli.bench.quantize import bench_device
    from fp4cli.cli.bench_output import CaseProgress, Recorder, quiet_compiler_warnings
    from fp4cli.cli.output import console_for
    from fp4cli.replay.cache import GRAPH_MODES
    from fp4cli.train import distributed
    from fp4cli.train.distributed import under_torchrun

    quiet_compiler_warnings()
    mode_list = parse_choices("modes", modes, bench.MODES)
    if interleave:
        graphs = parse_choices("layer-graphs", layer_graphs, GRAPH_MODES)
        bench.check_interleave(mode_list, graphs, nproc_per_node)
    spread = _spread(nproc_per_node, parallel, gather, mode_list, max_batch)
    if spread is not None and not under_torchrun():
        _check_names(split_list(tasks), split_list(recipes), size)
        raise typer.Exit(_launch(nproc_per_node))
    dist = None if spread is None else distributed.from_environment(spread.parallel)
    torch_device = bench_device(device if dist is None else distributed.rank_device(dist, device))
    backend_list = parse_choices("backends", backends, BACKENDS)
    gemm_list = parse_gemms(gemm)
    recompute_list = [c == "on" for c in parse_choices("recompute", recompute, ("off", "on"))]
    graph_list = parse_choices("layer-graphs", layer_graphs, GRAPH_MODES)
    recipe_list, task_list = split_list(recipes), split_list(tasks)
    # names first: a misspelt recipe is worth knowing before what the device lacks
    _check_names(task_list, recipe_list + split_list(max_batch or ""), size)
    bench.check_step_request(mode_list, steps, torch_device, recompute_list, graph_list)
    check_kernel_backends(backend_list, torch_device)
    case_list = bench.cases(
        task_list, size, batch_size, recipe_list, backend_list, mode_list, gemm_list,
        recompute_list, graph_list,
    )  # fmt: skip
    if dist is not None:
        spread_list = distributed_step.spread_cases(case_list, spread)
        _spread_bench(spread_list, dist, torch_device, steps, store, no_store)
        return
    batch_rows = []
    with Recorder("step", store, no_store, torch_device) as recorder:
        with CaseProgress(len(case_list), "step") as progress:
            rows = bench.run_step_bench(
                case_list, torch_device, steps, on_case=progress.step_case,
                on_rows=recorder.record, interleave=interleave,
            )  # fmt: skip
        for task in task_list:
            task_size, start = bench.BENCH_SIZES.get(task, ("default", 8))
            for recipe in split_list(max_batch or ""):
                for again in [False] if recipe == "bf16" else recompute_list:
                    found = bench.max_batch(
                        task, size or task_size, recipe, backend_list[0], torch_device,
                        batch_size or start, max_batch_limit, again,
                    )  # fmt: skip
                    recorder.record([found])
                    batch_rows.append(found)
    table = _step_table(rows, torch_device)
    console_for(table).print(table)
    if batch_rows:
        batches = _batch_table(batch_rows)
        console_for(batches).print(batches)
    typer.echo(recorder.summary())


def _spread(
    nproc: int, parallel: str | None, gather: str | None, modes: list[str], max_batch: str | None
) -> Any:
    """The processes and parallelism of a step on several processes (checked), or None."""
    from fp4cli.bench.configs import BenchError
    from fp4cli.bench.distributed_step import GATHERS, Spread, check_spread
    from fp4cli.bench.parsing import split_list

    if nproc == 1:
        if parallel is not None or gather is not None:
            raise BenchError("--parallel and --gather: with --nproc-per-node 2 or more")
        return None
    gathers = tuple(split_list(gather)) if gather is not None else GATHERS
    spread = Spread(nproc, parallel or "fsdp", gathers)
    check_spread(spread, modes, max_batch)
    return spread


def _launch(nproc: int) -> int:
    """This command again as torchrun's `nproc` workers (one node); their exit code."""
    import sys

    from fp4cli.train.launch import run_torchrun, torchrun_command

    arguments = sys.argv[1:]
    options = arguments[arguments.index("step") + 1 :]
    return run_torchrun(torchrun_command(options, nproc, subcommand=("bench", "step")))


def _spread_bench(
    case_list: list[Any], dist: Any, device: Any, steps: int, store: Any, no_store: bool
) -> None:
    """Every rank measures; rank 0 records, shows progress and prints the table."""
    from fp4cli.bench.distributed_step import measure_spread_case
    from fp4cli.bench.step import run_step_bench
    from fp4cli.cli.bench_output import CaseProgress, Recorder
    from fp4cli.cli.output import console_for
    from fp4cli.train import distributed

    def measure(case: Any) -> Any:
        return measure_spread_case(case, dist, device, steps)

    distributed.join(dist, device)
    try:
        if not dist.is_main:
            run_step_bench(case_list, device, steps, measure=measure)
            return
        with (
            Recorder("step", store, no_store, device) as recorder,
            CaseProgress(len(case_list), "step") as progress,
        ):
            rows = run_step_bench(
                case_list, device, steps, progress.step_case, recorder.record, measure
            )
        table = _step_table(rows, device)
        console_for(table).print(table)
        typer.echo(recorder.summary())
    finally:
        distributed.leave(dist)


def _check_names(tasks: list[str], recipes: list[str], size: str | None) -> None:
    """One-line errors for unknown tasks, sizes and recipes, before anything runs."""
    from fp4cli.bench.configs import BenchError
    from fp4cli.bench.step import BENCH_SIZES
    from fp4cli.recipes import load_recipe
    from fp4cli.tasks.base import task_defaults, task_names, task_sizes

    if not tasks:
        raise BenchError("tasks: give at least one, e.g. gpt")
    for task in tasks:
        if task not in task_names():
            raise BenchError(f"unknown task {task!r}; known: {', '.join(task_names())}")
        task_size = size or BENCH_SIZES.get(task, ("default", 8))[0]
        if task_defaults(task, task_size) is None:
            sizes = ", ".join(task_sizes(task))
            raise BenchError(f"task {task!r} has no size {task_size!r}; sizes: {sizes}")
    for recipe in recipes:
        load_recipe(recipe)  # RecipeError names what is wrong


def _step_table(rows: list[Any], device: Any) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from fp4cli.cli.bench_output import significant
    from fp4cli.train.loop import device_name

    caption = (
        "ms/step: the median of 3 timed loops (forward, backward, clipping, AdamW); x bf16: over "
        "the bf16 recipe in the same mode; peak GiB: the largest allocation of the timed steps; "
        "saved GiB: the distinct tensors one forward keeps for the backward (not compiled)."
    )
    spread = rows[0].case.processes > 1 if rows else False
    title = f"training step on {device_name(device)}"
    if spread:
        case = rows[0].case
        title += f", {case.processes} processes, {PARALLEL_NAMES[case.parallel]}"
        caption += (
            " gather MiB: one all-gather of the quantized layers' weights (x bf16: over the "
            "same in BF16). 1 process ms: a rank's share of the batch stepped alone; scaling: "
            "that over ms/step (N processes' samples/s over N times one's)."
        )
    table = Table(title=title, box=box.SIMPLE_HEAD, caption=caption)
    spread_columns = ("gather MiB", "x bf16 gather", "1 process ms", "scaling")
    columns = (*STEP_COLUMNS, *spread_columns) if spread else STEP_COLUMNS
    for column in columns:
        table.add_column(column, justify="left" if column in STEP_COLUMNS[:4] else "right")
    table.add_column("executors / note", style="yellow")
    for index, row in enumerate(rows):
        case = row.case
        previous = rows[index - 1].case if index else case
        if (case.task, case.mode) != (previous.task, previous.mode):
            table.add_section()
        task = f"{case.task} {case.size} x{case.batch}"
        ratio = significant(row.vs_baseline, 3) + ("x" if row.vs_baseline else "")
        memory = significant(row.memory_vs_baseline, 3) + ("x" if row.memory_vs_baseline else "")
        saved = significant(row.saved_vs_baseline, 3) + ("x" if row.saved_vs_baseline else "")
        cells = [task, case.label, case.backend, case.mode, significant(row.ms), ratio,
                 significant(row.peak_gib), memory, significant(row.saved_gib), saved]  # fmt: skip
        if spread:
            vs = significant(row.gather_vs_bf16, 3) + ("x" if row.gather_vs_bf16 else "")
            cells += [significant(row.gather_mib), vs, significant(row.one_process_ms),
                      significant(row.scaling, 3)]  # fmt: skip
        table.add_row(*map(Text, [*cells, row.note or row.executors]))
    return table


def _batch_table(rows: list[Any]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title="largest batch that fits (eager step)", box=box.SIMPLE_HEAD)
    for column in ("task", "recipe", "max batch", "note"):
        table.add_column(column)
    for row in rows:
        found = "-" if row.max_batch is None else str(row.max_batch)
        table.add_row(f"{row.task} {row.size}", row.label, found, row.note or "")
    return table
