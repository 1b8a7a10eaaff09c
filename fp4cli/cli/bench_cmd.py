"""`fp4 bench`: kernel benchmarks, measured side by side and kept in the run store."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fp4cli.cli.bench_layer_cmd import layer_command
from fp4cli.cli.bench_options import DeviceOption, NoStoreOption, StoreOption
from fp4cli.cli.bench_output import CaseProgress, Recorder, quiet_compiler_warnings, significant
from fp4cli.cli.bench_step_cmd import step_command

Opt = typer.Option

app = typer.Typer(
    help="Benchmark the kernels side by side; every measurement goes to the run store.",
    no_args_is_help=True,
)


DEFAULT_SHAPES = "4096x4096,16384x8192,8192x28672"
DEFAULT_CONFIGS = "mxfp4,mxfp4-rht32-sr,nvfp4"
COLUMNS = ("shape", "config", "kernel", "backend", "ms", "GB/s", "x copy", "Triton speedup")


@app.command("quantize")
def quantize_command(
    shapes: Annotated[str, Opt(help="Comma-separated tensor shapes, e.g. 4096x4096.")] = (
        DEFAULT_SHAPES
    ),
    configs: Annotated[
        str,
        Opt(
            help="Comma-separated: mxfp4, mxfp4-rht32-sr, nvfp4, nvfp4-rht16-sr (SR with 24 "
            "random bits a value), mxfp4-rht32-sr8, nvfp4-rht16-sr8 (with 8), nvfp4-4over6, "
            "nvfp4-outer128, nvfp4-outer128-rht16-sr (TetraJet-v2's: an FP32 scale per 128 "
            "values), nvfp4-eden-rht128 (Quartet II's backward operands), mxfp4-ceil, "
            "mxfp4-ue5m3, mxfp4-ue5m3-rht32-sr (ue5m3-hadamard-sr's backward operands)."
        ),
    ] = DEFAULT_CONFIGS,
    dtype: Annotated[str, Opt(help="Input dtype: bf16, fp16 or fp32.")] = "bf16",
    axis: Annotated[int, Opt(help="Quantization axis: -1 (along rows) or 0 (along columns).")] = -1,
    backends: Annotated[
        str,
        Opt(help="Comma-separated: triton, torch (the reference), compile (it, torch.compile'd)."),
    ] = "triton,torch,compile",
    iters: Annotated[
        int, Opt(min=1, help="Calls per timed loop; the time is the median of 5 loops.")
    ] = 20,
    timing: Annotated[
        str,
        Opt(
            help="loop: the calls issued from Python (their dispatch counts); graph: replayed "
            "from a CUDA graph (the GPU's time alone)."
        ),
    ] = "loop",
    device: DeviceOption = "auto",
    compile_timeout: Annotated[
        float,
        Opt(min=0, help="Stop waiting for a torch.compile after this many seconds (0: never)."),
    ] = 120.0,
    pair_directions: Annotated[
        bool,
        Opt(
            "--pair-directions",
            help="Also time each direction of a 2-D tensor's pair alone, to packed codes and to "
            "values (pair-rows, pair-cols, pair-rows-values, pair-cols-values), and a two-level "
            "config's amax pass of each (pair-rows-amax, pair-cols-amax); Triton only.",
        ),
    ] = False,
    store: StoreOption = None,
    no_store: NoStoreOption = False,
) -> None:
    """Quantize, fake-quantize and dequantize throughput: Triton kernels vs the reference.

    Each shape x config is measured in one process: the device's copy bandwidth, the Triton
    kernels, and the PyTorch reference, eager and under torch.compile. The table gives GB/s, the
    fraction of copy bandwidth and the Triton speedup; each number also goes to the run store.
    """
    from fp4cli.bench.configs import bench_configs
    from fp4cli.bench.parsing import parse_choices, parse_dtype, parse_shapes, split_list
    from fp4cli.bench.quantize import (
        BACKENDS,
        INTERPRETED_NOTICE,
        bench_device,
        check_request,
        interpreted,
        run_quantize_bench,
    )
    from fp4cli.cli.output import console_for

    quiet_compiler_warnings()
    shape_list = parse_shapes(shapes)
    config_names = [config.name for config in bench_configs(split_list(configs))]
    backend_list = parse_choices("backends", backends, BACKENDS)
    torch_dtype, torch_device = parse_dtype(dtype), bench_device(device)
    check_request(shape_list, axis, backend_list, iters, torch_device, timing, pair_directions)
    with (
        Recorder("quantize", store, no_store, torch_device) as recorder,
        CaseProgress(len(shape_list) * len(config_names), "quantize") as progress,
    ):
        if any(interpreted(backend, torch_device) for backend in backend_list):
            typer.echo(f"note: {INTERPRETED_NOTICE}", err=True)  # once the store is open
        rows = run_quantize_bench(
            shape_list, config_names, torch_dtype, axis, backend_list, iters, torch_device,
            timing=timing, compile_timeout_s=compile_timeout, on_case=progress.case,
            on_rows=recorder.record, pair_directions=pair_directions,
        )  # fmt: skip
    table = _table(rows, torch_device, dtype, axis, iters, timing)
    console_for(table).print(table)
    typer.echo(recorder.summary())


def _table(rows: list[Any], device: Any, dtype: str, axis: int, iters: int, timing: str) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from fp4cli.train.loop import device_name

    calls = f"{iters} calls per CUDA graph" if timing == "graph" else f"{iters} calls per loop"
    if any(row.iters != iters for row in rows):  # Triton's interpreter: one call a row
        calls += " (triton rows, interpreted: 1 call)"
    title = f"quantize on {device_name(device)}: {dtype}, axis {axis}, {calls}"
    table = Table(title=title, box=box.SIMPLE_HEAD, caption=_caption(rows))
    for column in COLUMNS:
        table.add_column(column, justify="right" if column in COLUMNS[4:] else "left")
    notes = any(row.note for row in rows)
    if notes:
        table.add_column("note", style="yellow")
    for row in rows:
        first = row.kernel == "copy"
        if first and row is not rows[0]:
            table.add_section()
        case = (row.case.shape_text, row.case.config.name) if first else ("", "")
        numbers = (significant(row.ms), significant(row.gbps), significant(row.copy_ratio, 2))
        speedup = significant(row.triton_speedup) + ("x" if row.triton_speedup else "")
        cells = [*case, row.kernel, row.backend, *numbers, speedup]
        table.add_row(*map(Text, cells), *([Text(row.note or "")] if notes else []))
    return table


def _caption(rows: list[Any]) -> str:
    caption = (
        "GB/s: bytes read + written once per call (quantize: input + codes + scales; "
        "fake-quantize: input + output; dequantize: codes + scales + output; copy: 2 x input;"
        " quantize-pair, a 2-D input quantized along its rows and down its columns from one"
        " read: input + both directions' codes + scales)."
    )
    if any(row.kernel.startswith("pair-") for row in rows):
        caption += (
            " pair-rows / pair-cols: one direction of the pair alone, input + its codes +"
            " scales (-values: input + its values)."
        )
    scaled = sorted(
        {row.case.config.name for row in rows if row.case.config.spec.whole_tensor_scale}
    )
    if scaled:
        caption += (
            f" {', '.join(scaled)}: the tensor amax pass reads the input a second time inside"
            " the timed call; the bytes count one read. tensor-amax times that pass alone (input"
            " bytes), quantize-given-amax the quantization after it; pair-amax the pair's amax"
            " pass alone, both directions' amaxes from one read (input bytes; pair-rows-amax,"
            " pair-cols-amax: one direction's)."
        )
    return caption


GEMM_COLUMNS = ("shape", "M x N x K", "impl", "ms", "TFLOP/s", "x bf16", "rel err", "max err",
                "beyond bf16")  # fmt: skip


@app.command("gemm")
def gemm_command(
    shapes: Annotated[
        str,
        Opt(help="Comma-separated MxNxK shapes or sets: square, gpt2-small, llama-7b."),
    ] = "square,gpt2-small,llama-7b",
    impls: Annotated[
        str,
        Opt(
            help="Comma-separated: cublas-bf16, cublas-fp8, dot-scaled, exact, fast, exact-fp8, "
            "fast-fp8, exact-fused, fast-fused (MXFP4 operands); nvfp4, nvfp4-decoded (NVFP4)."
        ),
    ] = "cublas-bf16,cublas-fp8,dot-scaled,exact,fast",
    rep_ms: Annotated[
        int, Opt(min=1, help="Milliseconds of timed calls per measurement (the median counts).")
    ] = 100,
    timing: Annotated[
        str,
        Opt(
            help="do-bench: each call launched and timed by triton.testing.do_bench (launch "
            "costs count where they exceed the GPU's); graph: 20 calls replayed from a CUDA "
            "graph (the GPU's time alone)."
        ),
    ] = "do-bench",
    outlier_channels: Annotated[
        int,
        Opt(min=0, help="Scale this many of A's K channels (activation outliers; 0: none)."),
    ] = 0,
    outlier_scale: Annotated[
        float, Opt(help="How many times larger the outlier channels are.")
    ] = 200.0,
    device: DeviceOption = "auto",
    store: StoreOption = None,
    no_store: NoStoreOption = False,
) -> None:
    """FP4 GEMM throughput and error: cuBLAS bf16 and FP8, Triton's tl.dot_scaled, fp4cli.

    Each shape's operands are random normal matrices quantized along K to MXFP4, and to NVFP4
    for the nvfp4 implementations; with --outlier-channels, that many of A's channels are
    --outlier-scale times larger. Every implementation of a format multiplies the same
    operands, in one process: TFLOP/s, the ratio to cuBLAS bf16 (on the dequantized operands),
    and the error against the format's float64 reference (relative, largest, and beyond the
    bf16 output's rounding). Each number also goes to the run store.
    """
    from fp4cli.bench.gemm import Outliers, check_gemm_request, run_gemm_bench
    from fp4cli.bench.gemm_cases import parse_gemm_shapes, parse_impls
    from fp4cli.bench.quantize import bench_device
    from fp4cli.cli.output import console_for

    shape_list, impl_list = parse_gemm_shapes(shapes), parse_impls(impls)
    torch_device = bench_device(device)
    outliers = Outliers(outlier_channels, outlier_scale) if outlier_channels else None
    check_gemm_request(shape_list, torch_device, timing, outliers, rep_ms)
    with (
        Recorder("gemm", store, no_store, torch_device) as recorder,
        CaseProgress(len(shape_list), "gemm") as progress,
    ):
        rows = run_gemm_bench(
            shape_list, impl_list, torch_device, rep_ms=rep_ms, timing=timing,
            outliers=outliers, on_case=progress.gemm_case, on_rows=recorder.record,
        )  # fmt: skip
    table = _gemm_table(rows, torch_device, timing)
    console_for(table).print(table)
    typer.echo(recorder.summary())


def _gemm_table(rows: list[Any], device: Any, timing: str) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from fp4cli.train.loop import device_name

    caption = (
        "x bf16: throughput over cuBLAS bf16's on the same operands (timed first and last, the "
        "faster counts). rel err: ||C - C64|| / "
        "||C64|| against the float64 reference of the operands' format (MXFP4: the dequantized "
        "product; NVFP4: alpha times the block-scaled sums); max err: max |C - C64| / max "
        "|C64|; beyond bf16: against C64 rounded to bf16 (what the output rounding alone leaves "
        "is 0). fp4cli times include preparing the operands."
    )
    if timing == "graph":
        caption += " Times: 20 calls replayed from a CUDA graph (no launch costs)."
    outliers = rows[0].outliers if rows else None
    with_outliers = f", A with outliers ({outliers.text})" if outliers else ""
    table = Table(
        title=f"{_formats(rows)} GEMM on {device_name(device)}, bf16 output{with_outliers}",
        box=box.SIMPLE_HEAD,
        caption=caption,
    )
    for column in GEMM_COLUMNS:
        table.add_column(column, justify="left" if column in GEMM_COLUMNS[:3] else "right")
    notes = any(row.note for row in rows)
    if notes:
        table.add_column("note", style="yellow")
    for index, row in enumerate(rows):
        first = index == 0 or row.shape is not rows[index - 1].shape
        if first and index > 0:
            table.add_section()
        shape = (row.shape.name, row.shape.text) if first else ("", "")
        ratio = significant(row.vs_baseline) + ("x" if row.vs_baseline else "")
        nvfp4_baseline = row.impl == "cublas-bf16" and row.format == "nvfp4"
        impl = row.impl + (" (nvfp4)" if nvfp4_baseline else "")
        errors = [_error(row.rel_error), _error(row.max_error), _error(row.beyond_rounding)]
        cells = [*shape, impl, significant(row.ms), significant(row.tflops), ratio, *errors]
        table.add_row(*map(Text, cells + ([row.note or ""] if notes else [])))
    return table


def _formats(rows: list[Any]) -> str:
    """MXFP4, NVFP4 or both, as the rows' operands are."""
    return " and ".join(name.upper() for name in dict.fromkeys(row.format for row in rows))


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


app.command("step")(step_command)
app.command("layer")(layer_command)
