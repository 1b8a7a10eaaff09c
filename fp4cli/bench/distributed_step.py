"""`fp4 bench step --nproc-per-node N`: the training step on N processes (DDP or FSDP2), each
recipe side by side with BF16, and under FSDP2 each FP4 recipe with its weights all-gathered in
FP4 and in BF16 (`fp4cli.train.packed_gather`).

The command starts itself again under torchrun; every rank builds the case's model as `fp4
train` does (quantized, marked for the packed gather, wrapped), takes its rows of each global
batch, and times eager steps (a CUDA graph step runs on one process). Rank 0 reports its time,
the largest peak memory of the ranks, and the bytes one all-gather of the quantized layers'
weights moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp4cli.bench.baseline import BASELINE, case_recipe, failure_note, release
from fp4cli.bench.configs import BenchError
from fp4cli.bench.step import StepCase, StepRow, stepper

GATHERS = ("packed", "bf16")  # FSDP2's all-gather of the quantized weights
PARALLELS = ("fsdp", "ddp")


@dataclass(frozen=True)
class Spread:
    """How the steps run: on `processes` ranks under `parallel`; FP4 recipes once per gather."""

    processes: int
    parallel: str
    gathers: tuple[str, ...] = GATHERS


def check_spread(spread: Spread, modes: Sequence[str], max_batch: str | None) -> None:
    """One-line errors for what a step on several processes cannot measure."""
    if spread.parallel not in PARALLELS:
        raise BenchError(f"parallel: must be fsdp or ddp (got {spread.parallel!r})")
    if spread.processes < 2:
        raise BenchError("--parallel and --gather: with --nproc-per-node 2 or more")
    not_eager = [mode for mode in modes if mode != "eager"]
    if not_eager:
        raise BenchError(
            f"modes {', '.join(not_eager)}: steps on several processes run eagerly (--modes eager)"
        )
    if max_batch:
        raise BenchError("--max-batch: on one process only")
    unknown = [gather for gather in spread.gathers if gather not in GATHERS]
    if unknown or not spread.gathers:
        raise BenchError(f"gather: packed, bf16 or both (got {','.join(spread.gathers)!r})")


def spread_cases(cases: Sequence[StepCase], spread: Spread) -> list[StepCase]:
    """Every case on the spread's processes; under FSDP2 an FP4 recipe once per gather."""
    gathers = spread.gathers if spread.parallel == "fsdp" else ("",)
    found = []
    for case in cases:
        for gather in ("",) if case.recipe == BASELINE else gathers:
            found.append(
                dataclasses.replace(
                    case, processes=spread.processes, parallel=spread.parallel, gather=gather
                )
            )
    return found


def measure_spread_case(case: StepCase, dist: Any, device: torch.device, steps: int) -> StepRow:
    """This rank's milliseconds per step (the median of 3 timed loops), the largest peak GiB
    of the ranks, the gather's bytes, and the scaling: this rank's share of the batch stepped
    alone (no collectives, every rank at once on its own device) over the spread step. Every
    rank measures every case in order: each case's collectives meet."""
    row = StepRow(case)
    try:
        row.ms, row.peak_gib, report = _spread_ms(case, dist, device, steps)
        if report is not None:
            row.gather_mib = report.bytes / 2**20
            row.gather_vs_bf16 = report.ratio
        release(device)
        row.one_process_ms = _one_process_ms(case, dist, device, steps)
    except Exception as error:  # noqa: BLE001  (a case that cannot run gets a note, not a crash)
        row.note = failure_note(error)
    finally:
        release(device)
    return row


def _spread_ms(
    case: StepCase, dist: Any, device: torch.device, steps: int
) -> tuple[float, float | None, Any]:
    """(ms per step on the ranks, the largest peak GiB of the ranks, the gather report)."""
    from fp4cli.train import distributed

    runner, batches, report = _build_spread_step(case, dist, device)
    ms = _timed(runner, batches, device, steps, lambda: distributed.barrier(dist))
    peak = None
    if device.type == "cuda":
        top = torch.tensor(torch.cuda.max_memory_allocated(device) / 2**30, device=device)
        torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX)
        peak = float(top)
    return ms, peak, report


def _one_process_ms(case: StepCase, dist: Any, device: torch.device, steps: int) -> float:
    """ms per step of this rank's share of the batch, trained alone (`step.build_step`)."""
    from fp4cli.bench.step import build_step
    from fp4cli.train import distributed

    share = max(1, case.batch // dist.world_size)
    alone = dataclasses.replace(case, batch=share, processes=1, parallel="", gather="")
    runner, batches, _ = build_step(alone, device)
    ms = _timed(runner, batches, device, steps, lambda: None)
    distributed.barrier(dist)  # the ranks leave the case together
    return ms


def _timed(runner: Any, batches: list[Any], device: torch.device, steps: int, align: Any) -> float:
    """The median of 3 loops of `steps` steps after 3 warm-up steps; `align` before timing."""
    from fp4cli.bench.timing import median_ms, synchronize

    step = stepper(runner, batches)
    for _ in range(3):
        step()
    synchronize(device)
    align()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return median_ms(step, device, steps, warmup=0, repeats=3)


def _build_spread_step(case: StepCase, dist: Any, device: torch.device) -> tuple[Any, Any, Any]:
    """(StepRunner, this rank's rows of two global batches, the gather report or None)."""
    import fp4cli
    from fp4cli.tasks.base import create_task
    from fp4cli.train import distributed
    from fp4cli.train.packed_gather import bf16_gather_report, mark_packed_weights
    from fp4cli.train.step import StepRunner

    torch.manual_seed(0)
    task = create_task(case.task, case.size, None, device)
    model = task.build_model()
    recipe = case_recipe(case.recipe, case.gemm)
    fp4cli.quantize_model(model, recipe, seed=0, backend=case.backend)
    report = None
    if case.gather == "packed":
        report = mark_packed_weights(model, dist.world_size)
    elif case.gather == "bf16":
        report = bf16_gather_report(model, "parallel.fp4_gather=false")
    wrapped = distributed.wrap(model, dist, device)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4, fused=device.type == "cuda")
    runner = StepRunner(wrapped, optimizer, task.loss, 1.0, device, cuda_graph=False)
    batches = [distributed.shard(task.batch(i, case.batch, 0), dist) for i in range(2)]
    return runner, batches, report
