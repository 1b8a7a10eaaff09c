"""Benchmark rows into the run store: one store row per measured number."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from fp4cli.store import RunStore


class Measured(Protocol):
    def stored_config(self) -> dict[str, Any]: ...

    def measurements(self) -> list[tuple[str, float, str]]: ...


def store_rows(
    store: RunStore,
    kind: str,
    device: str,
    versions: Mapping[str, str | None],
    rows: Iterable[Measured],
) -> int:
    """Log every measurement of `rows` as a benchmark of `kind`; returns how many were logged."""
    logged = 0
    for row in rows:
        config = row.stored_config()
        for name, value, unit in row.measurements():
            store.log_benchmark(kind, device, versions, config, name, value, unit)
            logged += 1
    return logged
