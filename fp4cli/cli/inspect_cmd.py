"""`fp4 quantize-inspect`: per-tensor quantization error of a model under several quantizers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

Opt = typer.Option
Arg = typer.Argument

METRIC_TITLES = {
    "snr_db": "SNR dB (higher is better)",
    "rel_mse": "relative MSE (lower is better)",
    "clipped": "clipped share (saturated values)",
    "flushed": "flushed share (non-zero values quantized to 0)",
}
METRICS = tuple(METRIC_TITLES)
PROGRESS_MIN_TENSORS = 12  # fewer tensors take a moment: no bar
PER_TENSOR_PANELS = 6  # the PNG stacks tensors per panel up to this many, else pools them


def quantize_inspect(
    run: Annotated[
        str | None, Arg(metavar="RUN", help="A run id or unique prefix: its latest checkpoint.")
    ] = None,
    task: Annotated[
        str | None, Opt(help="regression, vit, diffusion, gpt or llama: its seed-0 model.")
    ] = None,
    size: Annotated[str | None, Opt(help="With --task: default (if unset) or debug.")] = None,
    file: Annotated[Path | None, Opt(help="A torch file: a tensor or a dict of tensors.")] = None,
    spec: Annotated[
        list[str] | None,
        Opt(help="A preset, repeatable. Unset: mxfp4 mxfp4-ceil nvfp4 mxfp4-ue5m3."),
    ] = None,
    hadamard: Annotated[
        list[int] | None, Opt(help="Add each spec with the RHT of this size (16..256), repeatable.")
    ] = None,
    metric: Annotated[
        str, Opt(help="What the tensor table shows: snr_db, rel_mse, clipped or flushed.")
    ] = "snr_db",
    device: Annotated[str, Opt(help="Where to quantize: cpu or cuda[:N].")] = "cpu",
    store: Annotated[
        Path | None, Opt(help="Run store (default $FP4_STORE or runs/fp4.db).")
    ] = None,
    as_json: Annotated[bool, Opt("--json", help="Print every number as JSON.")] = False,
    csv: Annotated[Path | None, Opt(help="Also write one row per tensor and spec here.")] = None,
    png: Annotated[Path | None, Opt(help="Also plot the scale-exponent histograms here.")] = None,
    quiet: Annotated[bool, Opt("--quiet", help="No progress bar.")] = False,
) -> None:
    """Quantization error per tensor under several quantizers, side by side.

    Tensors: from a run's checkpoint or a task's model, the 2-D *.weight tensors (linear layers
    and embedding tables; buffers such as weight_ema are left out; layers the run's recipe keeps
    in high precision are marked *); from --file, every floating tensor with 2+ dimensions.
    Each is quantized along its last axis (a weight's input dimension, as the forward GEMM does)
    in float32. With --hadamard N, the error of spec+rhtN is measured between the rotated tensor
    and its quantization (the transform is orthogonal: the same error as rotated back); a tensor
    whose last dimension is not a multiple of N shows n/a. Scale exponents: floor(log2) of each
    block's effective scale, for two-level specs (nvfp4, mxfp4-ue5m3) the block scale over the
    tensor scale; all-zero blocks are counted apart. Means are weighted by element count (the
    mean SNR is that of the mean rel_mse). Outliers, per tensor and per Hadamard transform:
    kurtosis, max/median |x| per row (token) and per column (channel), and the share of blocks
    whose largest |x| is over twice the second largest (one value sets the scale).
    """
    from fp4cli.analysis import quant_inspect as qi
    from fp4cli.cli.output import output_file

    output_file(csv, "--csv")
    output_file(png, "--png")
    variants = qi.make_variants(spec or qi.DEFAULT_SPECS, hadamard or ())
    _check_options(metric, device)
    source = _load_source(run, task, size, file, store)
    reports = [qi.inspect_tensor(t, variants, device) for t in _progress(source.tensors, quiet)]
    summary = qi.summarize(reports, variants)
    if as_json:
        _echo_json(source, variants, reports, summary)
    else:
        from fp4cli.cli.inspect_outliers import outlier_table
        from fp4cli.cli.output import console_for

        tables = (_tensor_table(source, variants, reports, summary, metric),
                  outlier_table(reports, variants), _summary_table(variants, summary))  # fmt: skip
        console = console_for(*tables)
        for table in tables:
            console.print(table)
    if csv is not None:
        typer.echo(f"wrote {_write_csv(csv, variants, reports)}", err=True)
    if png is not None:
        typer.echo(f"wrote {_write_png(png, variants, reports, summary)}", err=True)


def _check_options(metric: str, device: str) -> None:
    import torch

    from fp4cli.analysis.errors import AnalysisError

    if metric not in METRIC_TITLES:
        raise AnalysisError(f"--metric must be one of {', '.join(METRIC_TITLES)} (got {metric!r})")
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise AnalysisError(f"--device {device!r}: only cpu, or cuda[:N] where CUDA is available")


def _load_source(
    run: str | None, task: str | None, size: str | None, file: Path | None, store: Path | None
) -> Any:
    from fp4cli.analysis import quant_inspect as qi
    from fp4cli.analysis.errors import AnalysisError

    if sum(source is not None for source in (run, task, file)) != 1:
        raise AnalysisError("give exactly one source: RUN, --task NAME or --file PATH")
    if size is not None and task is None:
        raise AnalysisError("--size only applies with --task")
    if run is not None:
        return qi.from_run(store, run)
    if task is not None:
        return qi.from_task(task, size or "default")
    assert file is not None
    return qi.from_file(file)


def _progress(tensors: list[Any], quiet: bool) -> Any:
    from rich.console import Console
    from rich.progress import track

    hide = quiet or len(tensors) < PROGRESS_MIN_TENSORS
    console = Console(stderr=True)
    return track(tensors, "quantize", console=console, transient=True, disable=hide)


def _tensor_table(
    source: Any, variants: list[Any], reports: list[Any], summary: dict[str, Any], metric: str
) -> Any:
    """Rows: tensors (and under each, its Hadamard variants); columns: presets; then the means."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    presets = list(dict.fromkeys(v.preset for v in variants))
    sizes = list(dict.fromkeys(v.hadamard for v in variants))
    labels = {(v.preset, v.hadamard): v.label for v in variants}
    table = Table(box=box.SIMPLE_HEAD, title=METRIC_TITLES[metric], caption=_caption(source, sizes))
    table.add_column("tensor", overflow="fold")
    table.add_column("shape", justify="right")
    for preset in presets:
        table.add_column(preset, justify="right")
    for report in reports:
        for size in sizes:
            name = report.name + (" *" if report.high_precision else "")
            cells = [report.measurements[labels[preset, size]] for preset in presets]
            shape = "x".join(map(str, report.shape))
            row = (name, shape) if size is None else (f"  +rht{size}", "")
            table.add_row(*map(Text, row), *_cells(cells, metric))
    table.add_section()
    for size in sizes:
        cells = [summary[labels[preset, size]] for preset in presets]
        first = "mean" if size is None else f"  +rht{size}"
        table.add_row(Text(first, style="bold"), Text(""), *_cells(cells, metric))
    return table


def _caption(source: Any, sizes: list[int | None]) -> str:
    where = source.description
    if where["kind"] == "run":
        text = f"run {where['run']} at step {where['step']} ({where['task']}, {where['recipe']})"
        text += f"; * kept in high precision (skip: {', '.join(where['skip']) or 'none'})"
    elif where["kind"] == "task":
        text = f"task {where['task']} ({where['size']}), seed-0 init"
    else:
        text = f"file {where['path']}"
    if any(sizes):
        text += "; +rhtN: random Hadamard transform of size N, error in the rotated domain"
    return text + "; mean: weighted by elements"


def _cells(measurements: list[Any], metric: str) -> list[Any]:
    """Formatted cells of one row, the best value bold."""
    from rich.text import Text

    values = [None if m is None else getattr(m, metric) for m in measurements]
    present = [v for v in values if v is not None and v == v]  # NaN: no tensor applies
    best = (max if metric == "snr_db" else min)(present) if len(present) > 1 else None
    cells = []
    for value, measurement in zip(values, measurements, strict=True):
        if value is None or value != value:
            cells.append(_missing(measurement))
            continue
        text = _format(metric, value, exact=measurement.rel_mse == 0)
        cells.append(Text(text, style="bold" if value == best else ""))
    return cells


NOT_FINITE = "not finite"


def _missing(measurement: Any) -> Any:
    """The cell of a metric with no value: the input not finite, or no tensor applies."""
    from rich.text import Text

    if measurement is not None and measurement.nonfinite:
        return Text(NOT_FINITE, style="red")
    return Text("n/a", style="dim")


def _format(metric: str, value: float, exact: bool = False) -> str:
    if metric == "snr_db":
        return "exact" if exact else f"{value:.2f}"
    if metric == "rel_mse":
        return f"{value:.3g}"
    return f"{100 * value:.2f}%"


def _summary_table(variants: list[Any], summary: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    caption = "scale exp.: floor(log2) of the block scales, lowest..highest (the most common)"
    if any(summary[v.label].nonfinite for v in variants):
        caption += f"; {NOT_FINITE}: the input holds NaN or Inf, so its error has no value"
    table = Table(box=box.SIMPLE_HEAD, title="per spec, over tensors (weighted by elements)",
                  caption=caption)  # fmt: skip
    table.add_column("spec")
    for column in ("tensors", "SNR dB", "rel MSE", "clipped", "flushed"):
        table.add_column(column, justify="right")
    table.add_column("scale exp.", justify="right", no_wrap=True)
    for variant in variants:
        mean = summary[variant.label]
        if not mean.tensors:
            table.add_row(Text(variant.label), "0", *[Text("n/a", style="dim")] * 5)
            continue
        metrics = [_summary_cell(mean, m) for m in METRICS]
        exponents = _exponent_range(mean.scale_exponents, mean.zero_blocks, mean.nan_blocks)
        table.add_row(Text(variant.label), str(mean.tensors), *metrics, exponents)
    return table


def _summary_cell(mean: Any, metric: str) -> Any:
    value = getattr(mean, metric)
    if value != value:
        return _missing(mean)
    return _format(metric, value, mean.rel_mse == 0)


def _exponent_range(histogram: dict[int, int], zero_blocks: int, nan_blocks: int = 0) -> str:
    """'lo..hi (mode)' of floor(log2 scale), and the all-zero and non-finite blocks if any."""
    if not histogram:
        text = "-"
    else:
        mode = max(histogram, key=lambda e: (histogram[e], -e))
        text = f"{min(histogram)}..{max(histogram)} ({mode})"
    text += f" (+{zero_blocks} zero)" if zero_blocks else ""
    return text + (f" (+{nan_blocks} NaN/Inf)" if nan_blocks else "")


def _measurement_dict(measurement: Any) -> dict[str, Any] | None:
    import dataclasses
    import math

    if measurement is None:
        return None
    fields = dataclasses.asdict(measurement)
    for key, value in fields.items():  # strict JSON has no NaN (a spec no tensor applies to)
        if isinstance(value, float) and not math.isfinite(value):
            fields[key] = None
    fields["scale_exponents"] = {str(e): n for e, n in measurement.scale_exponents.items()}
    return fields


def _echo_json(
    source: Any, variants: list[Any], reports: list[Any], summary: dict[str, Any]
) -> None:
    from fp4cli.cli.inspect_outliers import outliers_json
    from fp4cli.cli.output import echo_json

    data = {
        "source": source.description,
        "variants": [
            {"label": v.label, "preset": v.preset, "spec": v.spec.to_dict(), "hadamard": v.hadamard}
            for v in variants
        ],
        "tensors": [
            {
                "name": r.name, "shape": list(r.shape), "elements": r.numel,
                "high_precision": r.high_precision,
                "results": {k: _measurement_dict(m) for k, m in r.measurements.items()},
                "outliers": outliers_json(r),
            }
            for r in reports
        ],
        "summary": {label: _measurement_dict(mean) for label, mean in summary.items()},
    }  # fmt: skip
    echo_json(data)


def _write_csv(path: Path, variants: list[Any], reports: list[Any]) -> Path:
    """One row per (tensor, spec); empty metrics where the spec does not apply; the outlier
    statistics of the tensor the spec quantizes."""
    import csv

    from fp4cli.cli.inspect_outliers import CSV_COLUMNS, outlier_csv_fields

    columns = ["tensor", "shape", "elements", "high_precision", "spec"]
    measured = [*METRICS, "zero_blocks", "nan_blocks", "nonfinite", "tensor_scale",
                "scale_exponents"]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*columns, *measured, *CSV_COLUMNS])
        for report, variant in ((r, v) for r in reports for v in variants):
            shape = "x".join(map(str, report.shape))
            row = [report.name, shape, report.numel, report.high_precision, variant.label]
            row += _csv_fields(report.measurements[variant.label], measured)
            writer.writerow([*row, *outlier_csv_fields(report, variant)])
    return path


def _csv_fields(measurement: Any, columns: list[str]) -> list[Any]:
    if measurement is None:
        return [""] * len(columns)
    fields = _measurement_dict(measurement)
    assert fields is not None
    fields["scale_exponents"] = " ".join(f"{e}:{n}" for e, n in fields["scale_exponents"].items())
    return ["" if fields[c] is None else fields[c] for c in columns]


def _write_png(
    path: Path, variants: list[Any], reports: list[Any], summary: dict[str, Any]
) -> Path:
    from fp4cli.analysis.plots import stacked_count_panels

    panels: dict[str, dict[str, dict[int, int]]] = {}
    for variant in variants:
        if len(reports) <= PER_TENSOR_PANELS:
            measured = [(r.name, r.measurements[variant.label]) for r in reports]
            panels[variant.label] = {n: m.scale_exponents for n, m in measured if m is not None}
        else:
            pooled = summary[variant.label].scale_exponents
            panels[f"{variant.label} ({len(reports)} tensors)"] = {"all": pooled}
    return stacked_count_panels(panels, path, xlabel="floor(log2 block scale)", ylabel="blocks")
