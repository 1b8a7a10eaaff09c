"""Output shared by the commands: strict JSON (NaN and inf become null), consoles as wide as
their tables, and the files and folders a command will write, checked before any work."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer


class OutputPathError(ValueError):
    """An output path the command cannot write; one line naming the option."""


def output_file(path: Path | None, option: str) -> None:
    """Refuse, before any work, a file path that is a folder or whose folder is a file."""
    if path is None:
        return
    if path.is_dir():
        raise OutputPathError(f"{option}: {path} is a folder; give a file path")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"{option}: {parent} is a file, not a folder")
            break


def output_folder(path: Path | None, option: str) -> None:
    """Refuse, before any work, a folder path that is a file (or lies under one)."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{option}: {path} is a file; give a folder")
    output_file(path / "x", option)


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float (at any depth of dicts and lists) replaced by None:
    strict JSON has no NaN or inf."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(strict_json(data), indent=2, allow_nan=False))


def console_for(*renderables: Any) -> Any:
    """A rich Console for printing `renderables`: on a terminal as wide as the terminal; into a
    file or a pipe at least as wide as the widest of them, so that no row wraps. A table's cells
    that do not fit a narrow terminal wrap onto more lines; none is cut short."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    for renderable in renderables:
        if isinstance(renderable, Table):
            for column in renderable.columns:
                if column.overflow == "ellipsis":
                    column.overflow = "fold"
    console = Console(highlight=False)
    if not console.is_terminal and renderables:
        unbounded = console.options.update_width(10_000)
        natural = max(Measurement.get(console, unbounded, r).maximum for r in renderables)
        console.width = max(console.width, natural)
    return console
