"""`fp4 recipes`: list the shipped recipes, show one fully resolved."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from fp4cli.linear.operands import GEMM_OPERANDS

if TYPE_CHECKING:
    from fp4cli.quant.spec import QuantSpec
    from fp4cli.recipes import Recipe

app = typer.Typer(help="List and inspect FP4 training recipes.", no_args_is_help=True)


@app.command("list")
def list_command(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the table as Markdown (the README's).")
    ] = False,
) -> None:
    """List the shipped recipes, where each comes from, and the GEMM operands it quantizes."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from fp4cli.cli.output import console_for
    from fp4cli.recipes import list_recipes, load_recipe

    names = list_recipes()
    if markdown:
        typer.echo(markdown_table(names), nl=False)
        return
    table = Table(
        title="shipped recipes (details: fp4 recipes show NAME)",
        box=box.SIMPLE_HEAD,
        show_lines=True,
    )
    table.add_column("recipe", min_width=max(map(len, names)), max_width=40)
    for gemm in GEMM_OPERANDS:
        table.add_column(gemm, no_wrap=True)
    table.add_column("techniques", no_wrap=True)
    for name in names:
        recipe = load_recipe(name)
        title = Text(name, style="bold").append("\n" + recipe.description, style="dim")
        if recipe.citation:
            title.append("\nsource: " + recipe.citation, style="italic")
        cells = [_gemm_cell(recipe, gemm) for gemm in GEMM_OPERANDS]
        table.add_row(title, *cells, _techniques(recipe))
    console_for(table).print(table)


@app.command("show")
def show_command(
    recipe: Annotated[str, typer.Argument(help="A shipped recipe name or a path to a .yaml file.")],
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            metavar="KEY=VALUE",
            help="Override a key, the value parsed as YAML (repeatable): "
            "--set linear.forward.x.rounding=sr --set linear.grad_weight.hadamard=32",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of YAML.")] = False,
) -> None:
    """Print a recipe fully resolved: base merged, presets expanded, overrides applied."""
    import json

    from fp4cli.recipes import apply_overrides, load_recipe

    resolved = apply_overrides(load_recipe(recipe), overrides or [])
    if as_json:
        typer.echo(json.dumps(resolved.to_dict(), indent=2))
    else:
        typer.echo(resolved.to_yaml(), nl=False)


def markdown_table(names: list[str]) -> str:
    """The recipes as a Markdown table: name, what it is, each GEMM's operands, techniques."""
    from fp4cli.recipes import load_recipe

    lines = ["| recipe | what it is | forward | grad_input | grad_weight | techniques |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        recipe = load_recipe(name)
        cells = [_gemm_cell(recipe, gemm) for gemm in GEMM_OPERANDS]
        cells = [f"`{name}`", recipe.description, *cells, _techniques(recipe)]
        lines.append("| " + " | ".join(c.replace("\n", "; ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _gemm_cell(recipe: Recipe, gemm: str) -> str:
    """One line per format: the operands that use it, e.g. 'dy,w mxfp4-ceil+sr'."""
    groups: dict[str, list[str]] = {}
    for op in GEMM_OPERANDS[gemm]:
        spec = recipe.linear.spec(f"{gemm}_{op}")
        if spec is not None:
            groups.setdefault(_label(spec), []).append(op)
    lines = [f"{','.join(ops)} {label}" for label, ops in groups.items()]
    hadamard = recipe.linear.hadamard(gemm)
    if hadamard is not None:  # rht: random signs; fht: fixed signs; dht: none
        lines.append(f"{hadamard.kind}{hadamard.size}")
    return "\n".join(lines) or "-"


def _label(spec: QuantSpec) -> str:
    """The preset a spec comes from, with the fields it changes ('nvfp4/e1m2',
    'mxfp4-ue5m3/ceil') and its rounding ('+sr', '+sr8' with 8 random bits), else its short
    form."""
    plain = spec.replace(rounding="rne", sr_prescale=1.0, eden_group=128, sr_bits=24)
    rounding = "" if spec.rounding == "rne" else f"+{spec.rounding}"
    rounding += f"{spec.sr_bits}" if spec.sr_bits != 24 else ""
    rounding += f"{spec.sr_prescale:g}" if spec.sr_prescale != 1 else ""
    rounding += f"/group{spec.eden_group}" if spec.eden_group != 128 else ""
    nearest = min(spec.PRESETS, key=lambda name: len(_changes(plain, name)))
    changed = _changes(plain, nearest)
    if len(changed) <= 1:
        return "/".join([nearest, *changed]) + rounding
    return spec.short()


def _changes(spec: QuantSpec, preset: str) -> list[str]:
    """The fields in which `spec` differs from a preset: values (a flag by its name)."""
    base = spec.preset(preset)
    return [
        field if isinstance(getattr(spec, field), bool) else str(getattr(spec, field))
        for field in spec.field_names()
        if getattr(spec, field) != getattr(base, field)
    ]


def _techniques(recipe: Recipe) -> str:
    lin = recipe.linear
    names = [name for name in ("double_quant", "dge", "outliers", "qema") if getattr(lin, name)]
    names += ["qramp"] if recipe.qramp else []
    names += ["osci_reset"] if recipe.osci_reset else []
    names += [f"gemm {lin.gemm}"] if lin.gemm != "dequantized" else []
    return "\n".join(names) or "-"
