"""What every `fp4 bench` command shares: a progress bar over its cases, the recorder that
keeps its rows in the run store, and how its tables write numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def quiet_compiler_warnings() -> None:
    """The benchmarks compile on purpose: torch.compile's advice (graph breaks, recompiles) is
    not for the reader of the table."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._dynamo.*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._inductor.*")


class CaseProgress:
    """A progress bar over the benchmark cases on stderr (silent when it is not a terminal)."""

    def __init__(self, total: int, what: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            console=console, transient=True, disable=not console.is_terminal,
        )  # fmt: skip
        self.task = self.progress.add_task(what, total=total)

    def __enter__(self) -> CaseProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def case(self, index: int, case: Any) -> None:
        description = f"quantize {case.shape_text} {case.config.name}"
        self.progress.update(self.task, completed=index, description=description)

    def gemm_case(self, index: int, shape: Any) -> None:
        description = f"gemm {shape.name or shape.text}"
        self.progress.update(self.task, completed=index, description=description)

    def layer_case(self, index: int, case: Any) -> None:
        description = f"layer {case.shape_text} {case.label} {case.backend}"
        self.progress.update(self.task, completed=index, description=description)

    def step_case(self, index: int, case: Any) -> None:
        description = f"step {case.task} {case.label} {case.backend} {case.mode}"
        self.progress.update(self.task, completed=index, description=description)


class Recorder:
    """Benchmark rows of one kind into the run store (or nowhere, --no-store) as they are
    measured: an interrupted run (Ctrl-C or SIGTERM) keeps what it did, says so on one line
    and exits 130."""

    def __init__(self, kind: str, path: Path | None, no_store: bool, device: Any) -> None:
        from fp4cli.store import RunStore
        from fp4cli.train.signals import stop_signals

        self.kind, self.device, self.logged = kind, device, 0
        self.store = None if no_store else RunStore(path)
        self._signals = stop_signals()  # SIGTERM stops as Ctrl-C does

    def __enter__(self) -> Recorder:
        self._signals.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close()
        self._signals.__exit__(None, None, None)
        if kind is KeyboardInterrupt:
            typer.echo(f"interrupted: {self.summary()}", err=True)
            raise typer.Exit(130)

    def record(self, rows: list[Any]) -> None:
        from fp4cli.bench.record import store_rows
        from fp4cli.train.loop import device_name, versions

        if self.store is not None:
            name = device_name(self.device)
            self.logged += store_rows(self.store, self.kind, name, versions(), rows)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def summary(self) -> str:
        if self.store is None:
            return "not stored (--no-store)"
        return f"{self.logged} measurements stored in {self.store.path}"


def significant(value: float | None, digits: int = 3) -> str:
    """`digits` significant digits; whole numbers from 10^digits up (2,543 rather than 2.54e+03)."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 10**digits else f"{value:.{digits}g}"
