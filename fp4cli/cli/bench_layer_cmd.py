"""`fp4 bench layer`: one linear layer's forward and backward per recipe, against nn.Linear."""

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

LAYER_COLUMNS = ("shape", "recipe", "backend", "ms", "TFLOP/s", "x bf16", "host us",
                 "x bf16 host", "saved MiB", "x bf16 saved")  # fmt: skip


def layer_command(
    shapes: Annotated[
        str,
        Opt(
            help="Comma-separated tokens x in_features x out_features, or named sets: "
            "gpt2-small, llama-7b (a block's four layers at 8192 tokens), square."
        ),
    ] = "8192x768x3072,8192x4096x11008",
    recipes: RecipesOption = "bf16,mxfp4,tetrajet,tseng-rht-sr,nvfp4",
    backends: BackendsOption = "triton",
    gemm: GemmsOption = None,
    timing: Annotated[
        str,
        Opt(
            help="loop: calls issued from Python, timed with events; graph: the calls replayed "
            "from a CUDA graph (the GPU's time alone)."
        ),
    ] = "loop",
    iters: Annotated[int, Opt(min=1, help="Calls per timed loop; the median of 5 loops.")] = 20,
    layer_graphs: LayerGraphsOption = "off",
    interleave: Annotated[
        bool,
        Opt(
            "--interleave",
            help="Build each shape's cases at once and alternate their timed loops (5 rounds, "
            "the medians), so that a drift of the host's speed falls on each alike. With "
            "--timing loop.",
        ),
    ] = False,
    device: DeviceOption = "auto",
    store: StoreOption = None,
    no_store: NoStoreOption = False,
) -> None:
    """One quantized linear layer's forward and backward (input, weight and bias gradients)
    per recipe, as a ratio to nn.Linear under BF16 autocast at the same shape, measured side by
    side in one process; and the bytes the forward keeps for the backward. Each number also
    goes to the run store (kind `layer`)."""
    from fp4cli.bench import layer as bench
    from fp4cli.bench.baseline import BACKENDS
    from fp4cli.bench.parsing import (
        check_kernel_backends,
        parse_choices,
        parse_gemms,
        split_list,
    )
    from fp4cli.bench.quantize import bench_device
    from fp4cli.cli.bench_output import CaseProgress, Recorder
    from fp4cli.cli.output import console_for
    from fp4cli.recipes import load_recipe
    from fp4cli.replay.cache import GRAPH_MODES

    torch_device = bench_device(device)
    shape_list = bench.parse_layer_shapes(shapes)
    backend_list = parse_choices("backends", backends, BACKENDS)
    gemm_list = parse_gemms(gemm)
    graph_list = parse_choices("layer-graphs", layer_graphs, GRAPH_MODES)
    recipe_list = split_list(recipes)
    for recipe in recipe_list:
        load_recipe(recipe)  # RecipeError names what is wrong
    bench.check_layer_request(shape_list, iters, timing, torch_device, graph_list, interleave)
    check_kernel_backends(backend_list, torch_device)
    case_list = bench.cases(shape_list, recipe_list, backend_list, gemm_list, graph_list)
    with (
        Recorder("layer", store, no_store, torch_device) as recorder,
        CaseProgress(len(case_list), "layer") as progress,
    ):
        rows = bench.run_layer_bench(
            case_list, torch_device, iters, timing, on_case=progress.layer_case,
            on_rows=recorder.record, interleave=interleave,
        )  # fmt: skip
    table = _layer_table(rows, torch_device, timing, iters)
    console_for(table).print(table)
    typer.echo(recorder.summary())


def _layer_table(rows: list[Any], device: Any, timing: str, iters: int) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from fp4cli.cli.bench_output import significant
    from fp4cli.train.loop import device_name

    calls = f"{iters} calls per CUDA graph" if timing == "graph" else f"{iters} calls per loop"
    caption = (
        "ms: forward under BF16 autocast + the input, weight and bias gradients, the median of 5 "
        "timed loops; TFLOP/s: the three GEMMs' work over that time; host us: the host's time "
        "to issue one call (Python and launches), the median of 5 loops without a "
        "synchronization; saved MiB: the distinct "
        "tensors the forward keeps for the backward; x bf16: over nn.Linear (bf16) at the shape."
    )
    title = f"linear layer forward + backward on {device_name(device)}, {calls}"
    table = Table(title=title, box=box.SIMPLE_HEAD, caption=caption)
    for column in LAYER_COLUMNS:
        table.add_column(column, justify="left" if column in LAYER_COLUMNS[:3] else "right")
    table.add_column("executor / note", style="yellow")
    for index, row in enumerate(rows):
        case = row.case
        if index and case.shape_text != rows[index - 1].case.shape_text:
            table.add_section()
        shape = f"{case.shape_text} {case.name}".strip()
        cells = [
            shape, case.label, case.backend, significant(row.ms),
            significant(row.tflops), _times(row.vs_baseline), significant(row.host_us),
            _times(row.host_vs_baseline), significant(row.saved_mib),
            _times(row.saved_vs_baseline), row.note or row.executor,
        ]  # fmt: skip
        table.add_row(*map(Text, cells))
    return table


def _times(value: float | None) -> str:
    from fp4cli.cli.bench_output import significant

    return significant(value, 3) + ("x" if value is not None else "")
