"""Progress reporting: the one channel through which training talks to a person."""

from __future__ import annotations

from typing import Any, Protocol


class Reporter(Protocol):
    def start(self, total_steps: int, first_step: int, description: str) -> None: ...

    def update(self, step: int, loss: float, samples_per_s: float) -> None: ...

    def message(self, text: str) -> None: ...

    def finish(self) -> None: ...


class SilentReporter:
    """Reports nothing (tests, sweeps in worker processes)."""

    def start(self, total_steps: int, first_step: int, description: str) -> None:
        pass

    def update(self, step: int, loss: float, samples_per_s: float) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass


def progress_bar(console: Any, *fields: str) -> Any:
    """A rich Progress: description, bar, done/total, the given text columns (formats of the
    task's fields), elapsed and remaining time."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *(TextColumn(field) for field in fields),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


class RichReporter:
    """A rich progress bar: step, loss, throughput and ETA."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        fields = ("loss {task.fields[loss]}", "{task.fields[rate]} samples/s")
        self.progress = progress_bar(self.console, *fields)
        self.task_id: Any = None

    def start(self, total_steps: int, first_step: int, description: str) -> None:
        self.progress.start()
        self.task_id = self.progress.add_task(
            description, total=total_steps, completed=first_step, loss="-", rate="-"
        )

    def update(self, step: int, loss: float, samples_per_s: float) -> None:
        self.progress.update(
            self.task_id, completed=step, loss=f"{loss:.4f}", rate=f"{samples_per_s:,.0f}"
        )

    def message(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)

    def finish(self) -> None:
        self.progress.stop()
