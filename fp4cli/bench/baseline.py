"""What the layer and step benchmarks share: the backends, cases measured in order, each
against the `bf16` case of its group, a note for a case that cannot run, and the clean-up
after each."""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

from fp4cli.bench.configs import error_line

BASELINE = "bf16"
BACKENDS = ("triton", "torch")  # the quantizers' (fp4cli.quant.backend), as a benchmark names them
Case = TypeVar("Case")


def recipe_backends(
    recipes: Sequence[str], backends: Sequence[str], gemms: Sequence[str] = ("",)
) -> list[tuple[str, str, str]]:
    """(recipe, backend, GEMM mode) triples with bf16 first, on the first backend only (it
    quantizes nothing), then every other recipe on every backend in every GEMM mode ("": the
    recipe's own `linear.gemm`)."""
    ordered = [BASELINE, *(r for r in recipes if r != BASELINE)]
    return [
        (recipe, backend, gemm)
        for recipe in ordered
        for backend in (backends[:1] if recipe == BASELINE else backends)
        for gemm in (("",) if recipe == BASELINE else gemms)
    ]


def case_recipe(name: str, gemm: str) -> Any:
    """The recipe a case runs: `name` loaded, its `linear.gemm` set to `gemm` if given."""
    from fp4cli.recipes import apply_overrides, load_recipe

    recipe = load_recipe(name)
    return apply_overrides(recipe, [f"linear.gemm={gemm}"]) if gemm else recipe


def case_label(recipe: str, gemm: str, recompute: bool = False) -> str:
    """How tables name a case's recipe: e.g. "mxfp4", "mxfp4 gemm=fast", "mxfp4 recompute"."""
    label = f"{recipe} gemm={gemm}" if gemm else recipe
    return f"{label} recompute" if recompute else label


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, or None where either is missing (or the baseline is 0)."""
    return None if value is None or not baseline else value / baseline


def measure_in_order(
    case_list: Sequence[Case],
    measure: Callable[[Case], Any],
    group: Callable[[Case], Hashable],
    on_case: Callable[[int, Case], None] | None = None,
    on_rows: Callable[[list[Any]], None] | None = None,
) -> list[Any]:
    """`measure(case)` of every case in order; each row's `baseline` is the row of the bf16 case
    (`case.recipe`) of its group, measured before it. `on_rows` gets each row when measured."""
    rows: list[Any] = []
    baselines: dict[Hashable, Any] = {}
    for index, case in enumerate(case_list):
        if on_case is not None:
            on_case(index, case)
        row = measure(case)
        if case.recipe == BASELINE:  # type: ignore[attr-defined]
            baselines[group(case)] = row
        row.baseline = baselines.get(group(case))
        rows.append(row)
        if on_rows is not None:
            on_rows([row])
    return rows


def measure_in_groups(
    case_list: Sequence[Case],
    measure_group: Callable[[list[Case], int], list[Any]],
    group: Callable[[Case], Hashable],
    on_rows: Callable[[list[Any]], None] | None = None,
) -> list[Any]:
    """`measure_group(cases, index of the first)` of the cases of each group (by `group`) at
    once; each row's `baseline` is the row of its group's bf16 case. `on_rows` gets each
    group's rows when measured."""
    groups: dict[Hashable, list[Case]] = {}
    for case in case_list:
        groups.setdefault(group(case), []).append(case)
    rows: list[Any] = []
    for cases in groups.values():
        measured = measure_group(cases, len(rows))
        baseline = next((row for row in measured if row.case.recipe == BASELINE), None)
        for row in measured:
            row.baseline = baseline
        rows += measured
        if on_rows is not None:
            on_rows(measured)
    return rows


def failure_note(error: Exception) -> str:
    """A case's note for an error that stopped it: out of memory, or the error's first line."""
    if isinstance(error, torch.OutOfMemoryError):
        return "out of memory"
    return error_line(error, 160)


def release(device: torch.device) -> None:
    """Free what a case left: Python's cycles, the device's cached blocks, compiled graphs, the
    quantized layers' programs and their CUDA graphs."""
    from fp4cli.linear.plans import PROGRAMS

    PROGRAMS.clear()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()
