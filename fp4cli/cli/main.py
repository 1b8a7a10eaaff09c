"""The `fp4` command: the root Typer app; each command group lives in its own module.

Nothing heavy is imported here or in the command modules at import time (STYLE.md 4): commands
import torch and the engine when they run, so `fp4 --help` is instant. A domain error (an
impossible recipe or spec, a missing file) becomes one red `error: ...` line and exit code 2; so
does an OS error about a path the user gave (a name too long, no permission), naming the path.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from fp4cli.cli import (
    bench_cmd,
    cost_cmd,
    data_cmd,
    inspect_cmd,
    oscillation_cmd,
    recipes_cmd,
    report_cmd,
    reproduce_cmd,
    runs_cmd,
    sweep_cmd,
    train_cmd,
)

# "module:Class" of the errors that mean "the request is impossible", not "the code is broken";
# other parts add theirs here. A class is looked up only if its module is already imported (it
# cannot have been raised otherwise), so this list costs no import.
DOMAIN_ERRORS = [
    "fp4cli.train.config:ConfigError",
    "fp4cli.tasks.base:TaskError",
    "fp4cli.recipe_schema:RecipeError",
    "fp4cli.quant.spec:SpecError",
    "builtins:FileNotFoundError",
    "fp4cli.store:StoreError",
    "fp4cli.bench.configs:BenchError",
    "fp4cli.gemm.operands:GemmError",
    "fp4cli.analysis.errors:AnalysisError",
    "fp4cli.cost.errors:CostError",
    "fp4cli.sweep.errors:SweepError",
    "fp4cli.train.checkpoint:CheckpointError",
    "fp4cli.cli.output:OutputPathError",
]
USER_ERROR_EXIT = 2


def _is_domain_error(error: BaseException) -> bool:
    for name in DOMAIN_ERRORS:
        module, _, cls = name.partition(":")
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(error, getattr(loaded, cls)):
            return True
    return False


def _names_a_path(error: OSError) -> bool:
    """An OS error about a named path (a name too long, a permission, a folder where a file
    was wanted): the path the user gave is wrong, not the code."""
    return isinstance(error.filename, (str, bytes, os.PathLike))


def _path_error_message(error: OSError) -> str:
    from fp4cli.pathtext import refused_path_message

    return refused_path_message(error.filename, error)


MAX_ERROR_CHARS = 600


def _print_error(message: str) -> None:
    from rich.console import Console

    text = " ".join(message.split())
    if len(text) > MAX_ERROR_CHARS:  # an error quotes an excerpt, never a whole file
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    console = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)
    console.print("error: " + text, style="red", markup=False)


def _usage_error_class() -> type[Exception]:
    """The UsageError of the click that typer runs on (typer 0.29 vendors its own copy, older
    typers use click's): found through typer's own BadParameter, which derives from it."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _usage_message(error: Any) -> str:
    """A usage error (a bad option value, an unknown option or command) with the command it
    was for and where to look: `fp4 bench step: Invalid value for '--steps': ...`."""
    ctx = getattr(error, "ctx", None)
    path = getattr(ctx, "command_path", "") or "fp4"
    return f"{path}: {error.format_message()} (see {path} --help)"


class _Group(TyperGroup):
    """The root group: every command is parsed and runs inside its invoke, so domain errors and
    usage errors are caught here and become one line."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _usage_error_class() as error:
            _exit_with(_usage_message(error))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _usage_error_class() as error:
            _exit_with(_usage_message(error))
        except Exception as error:
            if _is_domain_error(error):
                _exit_with(str(error))
            if isinstance(error, OSError) and _names_a_path(error):
                _exit_with(_path_error_message(error))
            raise


def _exit_with(message: str) -> NoReturn:
    """The one `error: ...` line, then exit code 2."""
    _print_error(message)
    raise typer.Exit(USER_ERROR_EXIT) from None


def _hide_flag_types() -> None:
    """Typer (0.29) prints a flag's type, `<bool>`, in --help; a flag takes no value, so its
    type column stays empty. Versions without the hook are left as they are."""
    import typer.core

    option = getattr(typer.core, "TyperOption", None)
    original = getattr(option, "display_type_rich", None)
    if option is None or original is None:
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if getattr(self, "is_flag", False) else original(self, ctx)

    option.display_type_rich = display_type_rich


_hide_flag_types()
app = typer.Typer(
    name="fp4",
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.add_typer(recipes_cmd.app, name="recipes")
app.add_typer(runs_cmd.app, name="runs")
app.command(name="train")(train_cmd.train)
app.add_typer(bench_cmd.app, name="bench")
app.command(name="sweep")(sweep_cmd.sweep)
app.command(name="report")(report_cmd.report)
app.command(name="oscillation-report")(oscillation_cmd.oscillation_report)
app.command(name="quantize-inspect")(inspect_cmd.quantize_inspect)
app.command(name="cost")(cost_cmd.cost)
app.command(name="reproduce")(reproduce_cmd.reproduce)
app.add_typer(data_cmd.app, name="data")


def _print_version(value: bool) -> None:
    if value:
        import fp4cli

        typer.echo(f"fp4cli {fp4cli.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """FP4 training research: recipes, training runs, benchmarks, analysis."""
