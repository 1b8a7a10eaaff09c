"""One training step of a task's model, per recipe x backend x mode, side by side with BF16.

A case builds the task's model at a named size, converts it with the recipe (quantizers on the
`backend`), and times `steps` training steps (forward under BF16 autocast, backward, gradient
clipping, fused AdamW) after warm-up, with `fp4cli.train.step.StepRunner`, the trainer's own
step: eager, replayed from a CUDA graph ("graph"), torch.compile'd ("compile"), or both
("compile-graph"). Each case reports milliseconds per step, the peak memory of the timed steps,
the bytes one forward pass keeps for the backward (not under torch.compile), and each as a
ratio to the `bf16` recipe in the same mode; `max_batch` finds the largest batch that fits in
memory.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4cli.bench.baseline import (
    BASELINE,
    case_label,
    case_recipe,
    failure_note,
    measure_in_groups,
    measure_in_order,
    ratio,
    recipe_backends,
    release,
)
from fp4cli.bench.configs import STEPS_MAX, BenchError, check_count, check_layer_graphs

MODES = ("eager", "graph", "compile", "compile-graph")
BENCH_SIZES = {"gpt": ("gpt2-small", 8), "vit": ("deit-small", 128)}  # size, batch


@dataclass(frozen=True)
class StepCase:
    task: str
    size: str
    batch: int
    recipe: str
    backend: str
    mode: str
    gemm: str = ""  # the recipe's linear.gemm changed to this ("": the recipe's own)
    recompute: bool = False  # saved quantized-layer outputs recomputed (fp4cli.linear.recompute)
    processes: int = 1  # more: DDP or FSDP2 (`parallel`) under torchrun (`distributed_step.py`)
    parallel: str = ""
    gather: str = ""  # FSDP2's all-gather of the quantized weights: packed or bf16
    layer_graphs: str = "off"  # how the layers' programs use CUDA graphs (fp4cli.replay.graphs)

    @property
    def label(self) -> str:
        label = case_label(self.recipe, self.gemm, self.recompute)
        if self.layer_graphs != "off":
            label += f" layer graphs {self.layer_graphs}"
        return f"{label} gather {self.gather}" if self.gather else label


@dataclass
class StepRow:
    """One case's time and memory, or why there are none."""

    case: StepCase
    ms: float | None = None
    peak_gib: float | None = None
    saved_gib: float | None = None  # what one forward keeps for the backward
    executors: str = ""  # how many quantized layers run which executor
    note: str | None = None
    gather_mib: float | None = None  # one all-gather of the quantized layers' weights (FSDP2)
    gather_vs_bf16: float | None = None
    one_process_ms: float | None = None  # a rank's share of the batch stepped alone
    baseline: StepRow | None = field(default=None, repr=False)

    @property
    def vs_baseline(self) -> float | None:
        return ratio(self.ms, self.baseline.ms if self.baseline else None)

    @property
    def scaling(self) -> float | None:
        """N processes' samples a second over N times one's at the same per-process batch:
        one process's step time over the spread step's."""
        return ratio(self.one_process_ms, self.ms)

    @property
    def memory_vs_baseline(self) -> float | None:
        return ratio(self.peak_gib, self.baseline.peak_gib if self.baseline else None)

    @property
    def saved_vs_baseline(self) -> float | None:
        return ratio(self.saved_gib, self.baseline.saved_gib if self.baseline else None)

    def stored_config(self) -> dict[str, Any]:
        return {**self.case.__dict__, "executors": self.executors}

    def measurements(self) -> list[tuple[str, float, str]]:
        values = [
            ("step_ms", self.ms, "ms"),
            ("peak_memory", self.peak_gib, "GiB"),
            ("saved_memory", self.saved_gib, "GiB"),
            ("vs_bf16", self.vs_baseline, "x"),
            ("memory_vs_bf16", self.memory_vs_baseline, "x"),
            ("saved_vs_bf16", self.saved_vs_baseline, "x"),
            ("gather_mib", self.gather_mib, "MiB"),
            ("gather_vs_bf16", self.gather_vs_bf16, "x"),
            ("one_process_ms", self.one_process_ms, "ms"),
            ("scaling", self.scaling, "x"),
        ]
        return [(name, value, unit) for name, value, unit in values if value is not None]


def cases(
    tasks: Sequence[str],
    size: str | None,
    batch: int | None,
    recipes: Sequence[str],
    backends: Sequence[str],
    modes: Sequence[str],
    gemms: Sequence[str] = ("",),
    recomputes: Sequence[bool] = (False,),
    layer_graphs: Sequence[str] = ("off",),
) -> list[StepCase]:
    """Every case, bf16 first in each task and mode (it is the baseline, on one backend, and
    recomputes nothing and has no layer programs to graph)."""
    found = []
    for task in tasks:
        task_size, task_batch = BENCH_SIZES.get(task, ("default", 8))
        shape = (task, size or task_size, batch or task_batch)
        for mode in modes:
            for recipe, backend, gemm in recipe_backends(recipes, backends, gemms):
                baseline = recipe == BASELINE
                for recompute in (False,) if baseline else recomputes:
                    for graphs in layer_graphs[:1] if baseline else layer_graphs:
                        found.append(StepCase(*shape, recipe, backend, mode, gemm, recompute,
                                              layer_graphs=graphs))  # fmt: skip
    return found


def check_step_request(
    modes: Sequence[str],
    steps: int,
    device: torch.device,
    recomputes: Sequence[bool] = (False,),
    layer_graphs: Sequence[str] = ("off",),
) -> None:
    check_count("steps", steps, STEPS_MAX)
    stepped = ", ".join(mode for mode in modes if mode.endswith("graph"))
    beside = f"modes {stepped}, whose step is one CUDA graph already" if stepped else ""
    check_layer_graphs(layer_graphs, device.type, beside)
    compiled = [mode for mode in modes if mode.startswith("compile")]
    if compiled and True in recomputes:
        from fp4cli.linear.recompute import NOT_COMPILED

        raise BenchError(f"recompute: not with modes {', '.join(compiled)} ({NOT_COMPILED})")
    graphed = [mode for mode in modes if mode.endswith("graph")]
    if graphed and device.type != "cuda":
        raise BenchError(f"modes {', '.join(graphed)}: CUDA graphs need a CUDA device")


def run_step_bench(
    case_list: Sequence[StepCase],
    device: torch.device,
    steps: int,
    on_case: Callable[[int, StepCase], None] | None = None,
    on_rows: Callable[[list[StepRow]], None] | None = None,
    measure: Callable[[StepCase], StepRow] | None = None,
    interleave: bool = False,
) -> list[StepRow]:
    """Measure every case in order (`measure_case`, or `measure`: on several processes,
    `distributed_step.measure_spread_case`), or with `interleave` each task and mode's cases
    together (`measure_interleaved`); each row's baseline is the bf16 case of its task and
    mode."""
    if not interleave:
        return measure_in_order(
            case_list, measure or (lambda case: measure_case(case, device, steps)), _group,
            on_case, on_rows,
        )  # fmt: skip
    return measure_in_groups(
        case_list,
        lambda group, first: measure_interleaved(group, device, steps, on_case, first),
        _group,
        on_rows,
    )


def _group(case: StepCase) -> tuple[Any, ...]:
    """The cases compared with one bf16 case: one task, size, batch and mode."""
    return case.task, case.size, case.batch, case.mode


def check_interleave(modes: Sequence[str], layer_graphs: Sequence[str], processes: int) -> None:
    """One-line errors for what `measure_interleaved` cannot hold at once."""
    if any(mode != "off" for mode in layer_graphs):
        raise BenchError(
            "--interleave: not with --layer-graphs (several models' layer graphs would pass "
            "the graphs held at once)"
        )
    if processes > 1:
        raise BenchError("--interleave: on one process")


@dataclass
class _Built:
    """A case built and warmed up, held while the group's loops alternate."""

    row: StepRow
    step: Callable[[], None]
    runner: Any
    batches: list[Any]
    resident: int  # bytes allocated by building and warming it up
    loops: list[float] = field(default_factory=list)


def measure_interleaved(
    group: Sequence[StepCase],
    device: torch.device,
    steps: int,
    on_case: Callable[[int, StepCase], None] | None = None,
    first_index: int = 0,
) -> list[StepRow]:
    """`measure_case` for cases held at once: each is built and warmed up, then 3 rounds time
    one loop of `steps` of each in turn, so that a drift of the host's speed falls on every
    case alike. ms: the median of a case's loops; peak: its own allocation (resident, from its
    building and warm-up) plus the most its loops added. Compiled models are held at once
    under a recompilation limit that takes them all (`compiled_together`)."""
    with compiled_together(len(group)):
        return _measure_interleaved(group, device, steps, on_case, first_index)


@contextlib.contextmanager
def compiled_together(models: int) -> Iterator[None]:
    """Within: torch.compile's recompilation limit times `models`, so that each of that many
    models of one class keeps the limit one model has alone. The compiled graphs of a function
    are cached on its code, shared by every model of the class; past the limit (8 by default)
    a further model would run eagerly."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    with config.patch({name: getattr(config, name) * max(models, 1)}):
        yield


def _measure_interleaved(
    group: Sequence[StepCase],
    device: torch.device,
    steps: int,
    on_case: Callable[[int, StepCase], None] | None,
    first_index: int,
) -> list[StepRow]:
    from fp4cli.bench.timing import loop_ms, synchronize
    from fp4cli.train.memory import saved_bytes

    rows, built = [], []
    try:
        for offset, case in enumerate(group):
            if on_case is not None:
                on_case(first_index + offset, case)
            row = StepRow(case)
            rows.append(row)
            try:
                built.append(_build_warm(row, device))
            except Exception as error:  # noqa: BLE001  (a case that cannot run gets a note)
                row.note = failure_note(error)
        for _ in range(3):
            for held in list(built):
                try:
                    allocated = _allocated(device)
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    held.loops.append(loop_ms(held.step, steps, device))
                    if device.type == "cuda":
                        added = torch.cuda.max_memory_allocated(device) - allocated
                        peak = (held.resident + added) / 2**30
                        held.row.peak_gib = max(held.row.peak_gib or 0.0, peak)
                except Exception as error:  # noqa: BLE001
                    held.row.note = failure_note(error)
                    built.remove(held)
        synchronize(device)
        for held in built:
            held.row.ms = statistics.median(held.loops)
            if held.row.case.mode.startswith("compile"):
                continue  # its saved tensors are the compiler's (`measure_case`)
            model, loss_of = held.runner.model, held.runner.loss_of
            try:
                saved = saved_bytes(
                    model, loss_of, held.batches[0], device, held.row.case.recompute
                )
                held.row.saved_gib = saved / 2**30
            except Exception as error:  # noqa: BLE001
                held.row.note = failure_note(error)
    finally:
        built.clear()
        release(device)
    return rows


def _build_warm(row: StepRow, device: torch.device) -> _Built:
    """A case's runner built and stepped 6 times (warm-up, a CUDA graph's capture)."""
    from fp4cli.bench.timing import synchronize

    allocated = _allocated(device)
    runner, batches, row.executors = build_step(row.case, device)
    step = stepper(runner, batches)
    for _ in range(6):
        step()
    synchronize(device)
    return _Built(row, step, runner, batches, _allocated(device) - allocated)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def measure_case(case: StepCase, device: torch.device, steps: int) -> StepRow:
    """Milliseconds per step (median of 3 timed loops of `steps`), peak GiB and saved GiB of
    one case."""
    from fp4cli.bench.timing import median_ms, synchronize
    from fp4cli.replay import graphs
    from fp4cli.train.memory import saved_bytes

    row = StepRow(case)
    with graphs(case.layer_graphs):
        try:
            runner, batches, executors = build_step(case, device)
            row.executors = executors
            step = stepper(runner, batches)
            for _ in range(6):  # eager warm-up, the CUDA graph's capture, compilation
                step()
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            row.ms = median_ms(step, device, steps, warmup=0, repeats=3)
            if device.type == "cuda":
                row.peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
            if not case.mode.startswith("compile"):  # after the timed steps, which it cannot touch
                saved = saved_bytes(
                    runner.model, runner.loss_of, batches[0], device, case.recompute
                )
                row.saved_gib = saved / 2**30
        except Exception as error:  # noqa: BLE001  (a case that cannot run gets a note, not a crash)
            row.note = failure_note(error)
        finally:
            release(device)
    return row


def stepper(runner: Any, batches: list[Any]) -> Callable[[], None]:
    """One training step a call, on the batches in turn."""
    calls = iter(range(1 << 62))

    def step() -> None:
        runner(batches[next(calls) % len(batches)])

    return step


def build_step(case: StepCase, device: torch.device) -> tuple[Any, list[Any], str]:
    """(StepRunner, two batches, executor summary) of a case."""
    import fp4cli
    from fp4cli.linear import quantized_layers
    from fp4cli.tasks.base import create_task
    from fp4cli.train.step import StepRunner, device_learning_rates

    torch.manual_seed(0)
    task = create_task(case.task, case.size, None, device)
    model = task.build_model()
    recipe = case_recipe(case.recipe, case.gemm)
    fp4cli.quantize_model(model, recipe, seed=0, backend=case.backend)
    graphed = case.mode.endswith("graph")
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, fused=device.type == "cuda", capturable=graphed
    )
    if graphed:
        device_learning_rates(optimizer, device)
    fp4cli.attach_qema(model, optimizer)
    train_model = torch.compile(model) if case.mode.startswith("compile") else model
    runner = StepRunner(
        train_model, optimizer, task.loss, 1.0, device, cuda_graph=graphed,
        recompute=case.recompute,
    )  # fmt: skip
    batches = [task.batch(i, case.batch, 0) for i in range(2)]
    counts: dict[str, int] = {}
    for layer in quantized_layers(model).values():
        executor = layer.executor()[0]
        counts[executor] = counts.get(executor, 0) + 1
    summary = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    return runner, batches, summary


@dataclass
class MaxBatchRow:
    task: str
    size: str
    recipe: str
    max_batch: int | None
    note: str | None = None
    recompute: bool = False

    @property
    def label(self) -> str:
        return case_label(self.recipe, "", self.recompute)

    def stored_config(self) -> dict[str, Any]:
        return {
            "task": self.task, "size": self.size, "recipe": self.recipe,
            "recompute": self.recompute,
        }  # fmt: skip

    def measurements(self) -> list[tuple[str, float, str]]:
        return [] if self.max_batch is None else [("max_batch", self.max_batch, "samples")]


def max_batch(
    task: str,
    size: str,
    recipe: str,
    backend: str,
    device: torch.device,
    start: int,
    limit: int,
    recompute: bool = False,
) -> MaxBatchRow:
    """The largest batch (to within 1/8, at most `limit`) whose eager step fits in memory:
    doubling from `start`, then halving the gap to the first that does not."""

    def fits(batch: int) -> bool:
        case = StepCase(task, size, batch, recipe, backend, "eager", recompute=recompute)
        row = measure_case(case, device, 1)
        if row.note is not None and row.note != "out of memory":
            raise BenchError(f"max batch of {recipe}: {row.note}")
        return row.note is None

    try:
        if not fits(start):
            return MaxBatchRow(task, size, recipe, None, f"batch {start} does not fit", recompute)
        good, bad = start, None
        while bad is None and good < limit:
            candidate = min(good * 2, limit)
            good, bad = (candidate, None) if fits(candidate) else (good, candidate)
        while bad is not None and bad - good > max(1, good // 8):
            middle = (good + bad) // 2
            good, bad = (middle, bad) if fits(middle) else (good, middle)
    except BenchError as error:
        return MaxBatchRow(task, size, recipe, None, str(error), recompute)
    note = f"the limit {limit}" if good >= limit else None
    return MaxBatchRow(task, size, recipe, good, note, recompute)
