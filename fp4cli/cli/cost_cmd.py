"""`fp4 cost`: the cost model's estimate of recipes on layer shapes, against BF16."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

Opt = typer.Option
DEFAULT_SHAPE = "8192x4096x4096"
COLUMNS = ("technique", "GEMM/operand", "GFLOP", "MB", "µs", "source")


def cost(
    recipes: Annotated[
        list[str],
        Opt("--recipe", "-r", help="A shipped recipe or a .yaml path (repeatable: side by side)."),
    ],
    shapes: Annotated[
        list[str] | None,
        Opt(
            "--shape",
            help="A linear layer, TOKENSxINxOUT (repeatable; ':bf16' appended keeps it in BF16). "
            f"Default {DEFAULT_SHAPE}.",
            show_default=False,
        ),
    ] = None,
    device: Annotated[
        str,
        Opt(
            help="A profile (h100, h100-fp4cli, h100-triton, h200, b200, a100), a GPU name, "
            "or auto."
        ),
    ] = "auto",
    measured: Annotated[
        bool,
        Opt(help="Use quantize kernels measured by `fp4 bench quantize` on this GPU."),
    ] = True,
    store: Annotated[
        Path | None,
        Opt(help="Run store (default $FP4_STORE or runs/fp4.db).", show_default=False),
    ] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Estimate the work each technique adds to a layer's three GEMMs, and the layer's time as
    a ratio to the same layer in BF16 (formulas: docs/cost-model.md)."""
    from fp4cli.cli.output import echo_json
    from fp4cli.cost import estimate_model, local_profile, parse_shape, profile_for
    from fp4cli.cost.measured import MeasuredRates, stored_rates
    from fp4cli.recipes import load_recipe

    layer_shapes = [parse_shape(text) for text in shapes or [DEFAULT_SHAPE]]
    profile, device_note = local_profile() if device == "auto" else (profile_for(device), "")
    rates, measured_note = MeasuredRates(), "not used (--no-measured)"
    if measured:
        rates, measured_note = stored_rates(str(store) if store else None, profile)
    estimates = []
    for name in recipes:
        recipe = load_recipe(name)
        model = estimate_model(recipe.linear, layer_shapes, profile, rates, qramp=recipe.qramp)
        estimates.append((recipe.name, model))
    if as_json:
        document = {
            "device": profile.to_dict(),
            "device_note": device_note,
            "measured": measured_note,
            "recipes": [{"recipe": name, **model.to_dict()} for name, model in estimates],
        }
        echo_json(document)
        return
    caption = _rates_caption(profile, rates, layer_shapes) + f"\nmeasured: {measured_note}."
    _print_tables(estimates, profile, device_note, caption)


def _print_tables(
    estimates: list[tuple[str, Any]], profile: Any, device_note: str, caption: str
) -> None:
    from fp4cli.cli.output import console_for

    tables = [_item_table(name, model, profile, device_note, caption) for name, model in estimates]
    if len(estimates) > 1:
        tables.append(_summary_table(estimates, profile))
    console = console_for(*tables)  # as wide as the tables: no column is cut
    for table in tables:
        console.print(table)


def _item_table(name: str, model: Any, profile: Any, device_note: str, caption: str) -> Any:
    from rich import box
    from rich.table import Table

    where = f"{profile.name} ({device_note or profile.description})"
    labels = ", ".join(layer.shape.label() for layer in model.layers)
    table = Table(title=f"{name} on {where}: {labels}", box=box.SIMPLE_HEAD)
    table.caption, table.caption_justify = caption, "left"
    for column in COLUMNS:
        if column in ("GFLOP", "MB", "µs"):
            table.add_column(column, justify="right", no_wrap=True)
        else:
            table.add_column(column, no_wrap=column != "source")
    for layer in model.layers:
        if len(model.layers) > 1:
            table.add_row("layer", layer.shape.label(), style="bold")
        for item in layer.items:
            gflop, megabytes = _significant(item.flops / 1e9), _significant(item.bytes / 1e6)
            micros = _micros(item.seconds)
            table.add_row(item.technique, item.target, gflop, megabytes, micros, item.source)
        table.add_section()
    table.add_row("total", "", "", "", _micros(model.seconds), style="bold")
    table.add_row("BF16", "", "", "", _micros(model.bf16_seconds))
    table.add_row("ratio vs BF16", "", "", "", f"{model.ratio:.3f}", style="bold")
    return table


def _summary_table(estimates: list[tuple[str, Any]], profile: Any) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=f"side by side on {profile.name}", box=box.SIMPLE_HEAD)
    for column in ("recipe", "µs", "BF16 µs", "ratio vs BF16"):
        table.add_column(column, justify="left" if column == "recipe" else "right")
    for name, model in estimates:
        seconds = (_micros(model.seconds), _micros(model.bf16_seconds))
        table.add_row(name, *seconds, f"{model.ratio:.3f}")
    return table


def _rates_caption(profile: Any, rates: Any, shapes: list[Any]) -> str:
    """The profile's rates and where each comes from; a GEMM rate that a measured `fp4 bench
    gemm` row replaces for some of the quantized `shapes` names that row too."""
    from fp4cli.cost.devices import PRECISIONS

    gemms = [_gemm_rate(precision, profile, rates, shapes) for precision in PRECISIONS]
    others = [
        f"memory {profile.bandwidth / 1e12:.2f} TB/s ({profile.kind('bandwidth')})",
        f"vector {profile.vector_ops / 1e12:.1f} Tops/s ({profile.kind('vector')})",
    ]
    return (
        f"{profile.name}: " + ", ".join([*gemms, *others]) + ". GFLOP: tensor-core FLOP for a "
        "GEMM, elementwise ops for a pass; a fused part's µs is what it adds to its pass."
    )


def _gemm_rate(precision: str, profile: Any, rates: Any, shapes: list[Any]) -> str:
    """`nvfp4 GEMM 746 TFLOP/s (assumed)`, with the measured rows that replace it, by shape:
    `(assumed; 8192x8192x8192 at 645 TFLOP/s, measured: fp4 bench gemm nvfp4-decoded <date>)`."""
    used: dict[Any, list[str]] = {}
    for shape in shapes:
        found = rates.gemm(precision, shape.gemm_flops) if shape.quantized else None
        if found is not None:
            used.setdefault(found, []).append(shape.label())
    notes = [profile.kind(precision)] + [
        f"{', '.join(labels)} at {_tflops(found.tflops * 1e12)}, {found.source}"
        for found, labels in used.items()
    ]
    return f"{precision} GEMM {_tflops(profile.gemm_flops(precision))} ({'; '.join(notes)})"


def _tflops(flops: float) -> str:
    return f"{flops / 1e12:,.0f} TFLOP/s"


def _significant(value: float) -> str:
    """3 significant digits; whole numbers from 1,000 up."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _micros(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"
