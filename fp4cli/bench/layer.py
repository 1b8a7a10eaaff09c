"""One linear layer's forward and backward, per recipe and backend, side by side with
`nn.Linear` under BF16 autocast.

A case is a shape (tokens x in_features x out_features), a recipe and a quantizer backend. The
layer has fp32 parameters and a bias, as in training; its input and output gradient are bf16.
One call is the forward under BF16 autocast and the gradients of the input, weight and bias:
what a training step asks of the layer, without the optimizer. The recipe's skip patterns do
not apply (the one layer is always quantized; a high-precision recipe runs `nn.Linear`).

Each case reports milliseconds per call (a loop of calls, or their replay from a CUDA graph),
the host's microseconds to issue one call (its Python and launches: what an eager training
loop waits for when the GPU is faster), and the bytes the forward keeps for the backward
(`fp4cli.train.memory`), each as a ratio to `bf16` at the same shape.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

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
from fp4cli.bench.configs import ITERS_MAX, BenchError, check_count, check_layer_graphs
from fp4cli.bench.gemm import CPU_MAX_FLOP
from fp4cli.bench.gemm_cases import SHAPE_SETS
from fp4cli.bench.parsing import split_list
from fp4cli.bench.timing import check_timing
from fp4cli.cost.errors import CostError
from fp4cli.cost.shapes import LayerShape, parse_shape


@dataclass(frozen=True)
class LayerCase:
    shape: LayerShape  # fp4 cost's: tokens x in_features x out_features
    recipe: str
    backend: str
    name: str = ""  # e.g. "gpt2 qkv", for a shape from a named set
    gemm: str = ""  # the recipe's linear.gemm changed to this ("": the recipe's own)
    layer_graphs: str = "off"  # how the layer's programs use CUDA graphs (fp4cli.replay.graphs)

    @property
    def label(self) -> str:
        label = case_label(self.recipe, self.gemm)
        return label if self.layer_graphs == "off" else f"{label} layer graphs {self.layer_graphs}"

    @property
    def shape_text(self) -> str:
        return self.shape.label()

    @property
    def flop(self) -> int:
        """The three GEMMs' multiply-adds, counted twice."""
        return 3 * self.shape.gemm_flops


@dataclass
class LayerRow:
    """One case's time and saved bytes, or why there are none."""

    case: LayerCase
    timing: str
    ms: float | None = None
    host_us: float | None = None  # host time to issue one call (`timing.host_us`)
    saved_mib: float | None = None
    executor: str = ""
    note: str | None = None
    baseline: LayerRow | None = field(default=None, repr=False)

    @property
    def vs_baseline(self) -> float | None:
        return ratio(self.ms, self.baseline.ms if self.baseline else None)

    @property
    def host_vs_baseline(self) -> float | None:
        return ratio(self.host_us, self.baseline.host_us if self.baseline else None)

    @property
    def saved_vs_baseline(self) -> float | None:
        return ratio(self.saved_mib, self.baseline.saved_mib if self.baseline else None)

    @property
    def tflops(self) -> float | None:
        return None if not self.ms else self.case.flop / (self.ms * 1e9)

    def stored_config(self) -> dict[str, Any]:
        case, shape = self.case, self.case.shape
        return {"tokens": shape.tokens, "in_features": shape.in_features,
                "out_features": shape.out_features, "recipe": case.recipe,
                "backend": case.backend, "name": case.name, "executor": self.executor,
                "timing": self.timing, "gemm": case.gemm,
                "layer_graphs": case.layer_graphs}  # fmt: skip

    def measurements(self) -> list[tuple[str, float, str]]:
        values = [
            ("layer_ms", self.ms, "ms"),
            ("host_us", self.host_us, "us"),
            ("saved_memory", self.saved_mib, "MiB"),
            ("vs_bf16", self.vs_baseline, "x"),
            ("host_vs_bf16", self.host_vs_baseline, "x"),
            ("saved_vs_bf16", self.saved_vs_baseline, "x"),
        ]
        return [(name, value, unit) for name, value, unit in values if value is not None]


def parse_layer_shapes(text: str) -> list[tuple[LayerShape, str]]:
    """'8192x768x3072,llama-7b' -> (shape, name) in order: tokens x in_features x out_features,
    or a named set of `fp4 bench gemm` (its GEMM M x N x K as the layer K -> N on M tokens)."""
    shapes: list[tuple[LayerShape, str]] = []
    for item in split_list(text):
        if item in SHAPE_SETS:
            shapes += [(LayerShape(g.m, g.k, g.n), g.name) for g in SHAPE_SETS[item]]
            continue
        shape = _cost_shape(item)
        if shape is None or not shape.quantized:
            raise BenchError(
                f"shape {item!r}: expected tokens x in_features x out_features, e.g. "
                "8192x768x3072 (every dimension must be at least 1), or one of "
                f"{', '.join(SHAPE_SETS)}"
            )
        shapes.append((shape, ""))
    if not shapes:
        raise BenchError(
            f"shapes: give at least one, e.g. 8192x768x3072 or {', '.join(SHAPE_SETS)}"
        )
    return shapes


def _cost_shape(text: str) -> LayerShape | None:
    try:
        return parse_shape(text)
    except CostError:
        return None


def cases(
    shapes: Sequence[tuple[LayerShape, str]],
    recipes: Sequence[str],
    backends: Sequence[str],
    gemms: Sequence[str] = ("",),
    layer_graphs: Sequence[str] = ("off",),
) -> list[LayerCase]:
    """Every case, bf16 first at each shape (the baseline, on one backend, with no layer
    programs to graph)."""
    return [
        LayerCase(shape, recipe, backend, name, gemm, graphs)
        for shape, name in shapes
        for recipe, backend, gemm in recipe_backends(recipes, backends, gemms)
        for graphs in (layer_graphs[:1] if recipe == BASELINE else layer_graphs)
    ]


def check_layer_request(
    shapes: Sequence[tuple[LayerShape, str]],
    iters: int,
    timing: str,
    device: torch.device,
    layer_graphs: Sequence[str] = ("off",),
    interleave: bool = False,
) -> None:
    """Raise BenchError for a request that cannot run (or would take minutes on a CPU)."""
    check_count("iters", iters, ITERS_MAX)
    check_timing(timing, device)
    graphed = "--timing graph, whose calls are one CUDA graph already" if timing == "graph" else ""
    check_layer_graphs(layer_graphs, device.type, graphed)
    if interleave and timing != "loop":
        raise BenchError(
            "--interleave: with --timing loop (a CUDA graph's replays do not wait on the host)"
        )
    if device.type == "cuda":
        return
    for shape, _ in shapes:
        if shape.gemm_flops > CPU_MAX_FLOP:
            raise BenchError(
                f"shape {shape.label()} is too large to measure on the CPU (up to 1024^3 "
                "here); give smaller --shapes or run on a GPU"
            )


def run_layer_bench(
    case_list: Sequence[LayerCase],
    device: torch.device,
    iters: int,
    timing: str = "loop",
    on_case: Callable[[int, LayerCase], None] | None = None,
    on_rows: Callable[[list[LayerRow]], None] | None = None,
    interleave: bool = False,
) -> list[LayerRow]:
    """Measure every case in order, or with `interleave` each shape's cases together
    (`measure_interleaved`); each row's baseline is the bf16 case of its shape."""
    if not interleave:
        return measure_in_order(
            case_list,
            lambda case: measure_case(case, device, iters, timing),
            lambda case: case.shape,
            on_case,
            on_rows,
        )
    return measure_in_groups(
        case_list,
        lambda group, first: measure_interleaved(group, device, iters, on_case, first),
        lambda case: case.shape,
        on_rows,
    )


INTERLEAVED_ROUNDS = 5


@dataclass
class _Held:
    """A built case of `measure_interleaved`: its row, its call and its loops' figures."""

    row: LayerRow
    call: Callable[[], Any]
    loops_ms: list[float] = field(default_factory=list)
    loops_host_us: list[float] = field(default_factory=list)


def measure_interleaved(
    group: Sequence[LayerCase],
    device: torch.device,
    iters: int,
    on_case: Callable[[int, LayerCase], None] | None = None,
    first_index: int = 0,
) -> list[LayerRow]:
    """`measure_case` (timing "loop") for cases held at once: each is built and warmed up,
    then each of INTERLEAVED_ROUNDS rounds times one loop and one host loop of every case in
    turn, so that a drift of the host's speed falls on every case alike. ms and host us: the
    medians of a case's loops."""
    from fp4cli.bench.timing import host_us, loop_ms, synchronize
    from fp4cli.replay import graphs

    rows, built = [], []
    try:
        for offset, case in enumerate(group):
            if on_case is not None:
                on_case(first_index + offset, case)
            row = LayerRow(case, "loop")
            rows.append(row)
            try:
                with graphs(case.layer_graphs):
                    call = prepared_call(row, device)
                    for _ in range(3):
                        call()
                built.append(_Held(row, call))
            except Exception as error:  # noqa: BLE001  (a case that cannot run gets a note)
                row.note = failure_note(error)
        synchronize(device)
        for _ in range(INTERLEAVED_ROUNDS):
            for held in list(built):
                try:
                    with graphs(held.row.case.layer_graphs):
                        held.loops_ms.append(loop_ms(held.call, iters, device))
                        held.loops_host_us.append(host_us(held.call, device, iters, repeats=1))
                except Exception as error:  # noqa: BLE001
                    held.row.note = failure_note(error)
                    built.remove(held)
        for held in built:
            held.row.ms = statistics.median(held.loops_ms)
            held.row.host_us = statistics.median(held.loops_host_us)
    finally:
        built.clear()
        release(device)
    return rows


def measure_case(case: LayerCase, device: torch.device, iters: int, timing: str) -> LayerRow:
    """Milliseconds per forward + backward (median of 5 timed loops), the host's microseconds
    to issue one, and saved MiB of a case."""
    from fp4cli.bench.timing import host_us, median_ms
    from fp4cli.replay import graphs

    row = LayerRow(case, timing)
    with graphs(case.layer_graphs):
        try:
            call = prepared_call(row, device)
            row.ms = median_ms(call, device, iters, warmup=3, repeats=5, timing=timing)
            row.host_us = host_us(call, device, iters)
        except Exception as error:  # noqa: BLE001  (a case that cannot run gets a note)
            row.note = failure_note(error)
        finally:
            release(device)
    return row


def prepared_call(row: LayerRow, device: torch.device) -> Callable[[], Any]:
    """The call of the row's case (`layer_call`), its executor and saved MiB set on the row."""
    from fp4cli.train.memory import forward_saved_bytes

    layer, row.executor = build_layer(row.case, device)
    x, grad_y = layer_data(row.case.shape, device)
    row.saved_mib = forward_saved_bytes(lambda: layer_forward(layer, x)) / 2**20
    return layer_call(layer, x, grad_y)


def build_layer(case: LayerCase, device: torch.device) -> tuple[nn.Module, str]:
    """The case's layer (fp32 parameters, seeded) and the executor its calls run."""
    from fp4cli.linear import QuantLinear

    torch.manual_seed(0)
    linear = nn.Linear(case.shape.in_features, case.shape.out_features, device=device)
    config = case_recipe(case.recipe, case.gemm).linear
    if config.is_high_precision:
        return linear, "nn.Linear"
    layer = QuantLinear.from_linear(linear, config, seed=0, backend=case.backend)
    name, why = layer.executor(torch.empty(0, device=device))
    return layer, f"{name} ({why})" if why else name


def layer_data(shape: LayerShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The input (bf16, requiring its gradient) and output gradient (bf16), seeded."""
    generator = torch.Generator(device).manual_seed(1)
    x = torch.randn(shape.tokens, shape.in_features, device=device, generator=generator)
    grad_y = torch.randn(shape.tokens, shape.out_features, device=device, generator=generator)
    return x.to(torch.bfloat16).requires_grad_(), grad_y.to(torch.bfloat16)


def layer_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward alone, under BF16 autocast."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return layer(x)


def layer_call(layer: nn.Module, x: torch.Tensor, grad_y: torch.Tensor) -> Callable[[], Any]:
    """One forward under BF16 autocast and the gradients of input, weight and bias."""
    wanted = [x, *layer.parameters()]

    def call() -> Any:
        return torch.autograd.grad(layer_forward(layer, x), wanted, grad_y)

    return call
