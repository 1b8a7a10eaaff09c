"""FP4 GEMMs measured side by side: cuBLAS bf16 and FP8, Triton's tl.dot_scaled, fp4cli.

For each shape, in one process: random normal A (M, K) and B (N, K) (with `Outliers`, some of
A's K channels scaled up, as real activations have them), quantized to MXFP4 along K, and to
NVFP4 when an `nvfp4` implementation is asked; the reference of each format in float64 (MXFP4:
the product of the dequantized operands; NVFP4: `nvfp4_matmul_reference`'s formula before its
rounding); then each implementation,
timed (the median of `triton.testing.do_bench` on a GPU, or of replays of a CUDA graph of 20
calls with timing "graph"; of timed loops on the CPU) and checked:
cuBLAS bf16 is timed first and again last, and the faster time counts (the ratios to it stay
conservative if the GPU's clock drifts during the shape);
its relative error against its format's reference (Frobenius norms), its largest error over
the reference's largest magnitude, and its error beyond the rounding of the output (against the
reference rounded to the output dtype). cuBLAS bf16 multiplies the dequantized operands of
MXFP4, or of NVFP4 when only NVFP4 implementations are asked. Times are end to end: fp4cli's
include preparing the operands. An implementation that cannot run gets a row with a note.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp4cli.bench.configs import REP_MS_MAX, BenchError, check_count
from fp4cli.bench.gemm_cases import BASELINE, IMPLS, NVFP4_IMPLS, GemmShape
from fp4cli.bench.timing import capture_note, check_timing, median_ms
from fp4cli.quant import QuantizedTensor, QuantSpec, quantize

SEED = 0
MXFP4 = QuantSpec.preset("mxfp4")
NVFP4 = QuantSpec.preset("nvfp4")
CPU_MAX_FLOP = 2 * 1024**3  # larger shapes would take minutes on a CPU (float64 reference first)
GEMM_TIMINGS = ("do-bench", "graph")
GRAPH_CALLS = 20


@dataclass(frozen=True)
class Outliers:
    """`channels` of A's K columns (drawn by the seed) multiplied by `scale`: activation
    outliers, which widen every row's range of block scales."""

    channels: int
    scale: float

    @property
    def text(self) -> str:
        return f"{self.channels} channels x{self.scale:g}"


@dataclass
class GemmRow:
    """One implementation on one shape: its time and errors, or why there are none."""

    shape: GemmShape
    impl: str
    ms: float | None = None
    rel_error: float | None = None
    beyond_rounding: float | None = None  # error against the reference rounded to the output
    max_error: float | None = None  # largest |error| over the reference's largest magnitude
    note: str | None = None
    format: str = "mxfp4"  # the operands' format
    first_ms: float | None = None  # the baseline's: its first of two timings
    baseline_ms: float | None = None  # cuBLAS bf16 on the same shape, same run
    dot_scaled_ms: float | None = None
    timing: str = "do-bench"  # or "graph": the GPU's time alone, without launching
    outliers: Outliers | None = None

    @property
    def tflops(self) -> float | None:
        return None if self.ms is None else self.shape.flop / (self.ms * 1e9)

    @property
    def vs_baseline(self) -> float | None:
        """How many times cuBLAS bf16's throughput."""
        return None if self.ms is None or not self.baseline_ms else self.baseline_ms / self.ms

    @property
    def vs_dot_scaled(self) -> float | None:
        return None if self.ms is None or not self.dot_scaled_ms else self.dot_scaled_ms / self.ms

    def stored_config(self) -> dict[str, Any]:
        shape = self.shape
        return {"m": shape.m, "n": shape.n, "k": shape.k, "shape": shape.name or shape.text,
                "impl": self.impl, "format": self.format, "out_dtype": "bf16",
                "timing": self.timing,
                "outliers": self.outliers.text if self.outliers else None}  # fmt: skip

    def measurements(self) -> list[tuple[str, float, str]]:
        """(name, value, unit) of what the store keeps for this row."""
        named = [
            ("ms", self.ms, "ms"),
            ("first_ms", self.first_ms, "ms"),
            ("tflops", self.tflops, "TFLOP/s"),
            ("x_cublas_bf16", self.vs_baseline, "x"),
            ("rel_error", self.rel_error, "1"),
            ("error_beyond_rounding", self.beyond_rounding, "1"),
            ("max_rel_error", self.max_error, "1"),
        ]
        return [(name, value, unit) for name, value, unit in named if value is not None]


def check_gemm_request(
    shapes: Sequence[GemmShape],
    device: torch.device,
    timing: str = "do-bench",
    outliers: Outliers | None = None,
    rep_ms: int = 100,
) -> None:
    """Refuse, in one line, an unknown timing, outliers that do not fit, too long a timing, and
    shapes too large to measure on a CPU."""
    check_timing(timing, device, GEMM_TIMINGS)
    check_count("rep_ms", rep_ms, REP_MS_MAX)
    if outliers is not None:
        if outliers.channels < 1 or not math.isfinite(outliers.scale) or outliers.scale <= 0:
            raise BenchError(
                f"outliers: {outliers.text}: give at least one channel and a positive finite scale"
            )
        for shape in shapes:
            if outliers.channels > shape.k:
                raise BenchError(
                    f"outliers: {outliers.channels} channels, but shape {shape.text} has K = "
                    f"{shape.k}"
                )
    if device.type == "cuda":
        return
    for shape in shapes:
        if shape.flop > CPU_MAX_FLOP:
            raise BenchError(
                f"shape {shape.text} is too large to measure on the CPU (up to 1024^3 here); "
                "give smaller --shapes or run on a GPU"
            )


def run_gemm_bench(
    shapes: Sequence[GemmShape],
    impls: Sequence[str],
    device: torch.device,
    *,
    rep_ms: int = 100,
    timing: str = "do-bench",
    outliers: Outliers | None = None,
    on_case: Callable[[int, GemmShape], None] | None = None,
    on_rows: Callable[[list[GemmRow]], None] | None = None,
) -> list[GemmRow]:
    """Measure every shape x implementation; `on_rows` gets each shape's rows when measured."""
    check_gemm_request(shapes, device, timing, outliers)
    rows: list[GemmRow] = []
    for index, shape in enumerate(shapes):
        if on_case is not None:
            on_case(index, shape)
        shape_rows = _shape_rows(shape, impls, device, rep_ms, timing, outliers)
        if on_rows is not None:
            on_rows(shape_rows)
        rows += shape_rows
        _free(device)
    return rows


def _shape_rows(
    shape: GemmShape,
    impls: Sequence[str],
    device: torch.device,
    rep_ms: int,
    timing: str,
    outliers: Outliers | None = None,
) -> list[GemmRow]:
    formats = operand_formats(impls)
    rows = [GemmRow(shape, impl, format=formats[impl], timing=timing, outliers=outliers)
            for impl in impls]  # fmt: skip
    kept = None  # the baseline's operands and reference, to time it again last
    for name in dict.fromkeys(formats.values()):
        a, b = _operands(shape, device, NVFP4 if name == "nvfp4" else MXFP4, outliers)
        reference = _reference(a, b, name)
        for row in rows:
            if row.format == name:
                _measure(row, a, b, reference, device, rep_ms)
        if formats.get(BASELINE) == name:
            kept = (a, b, reference)
        del a, b, reference
    baseline = next((row for row in rows if row.impl == BASELINE and row.ms is not None), None)
    if baseline is not None and baseline.ms is not None and kept is not None and len(rows) > 1:
        first = baseline.first_ms = baseline.ms
        _measure(baseline, *kept, device, rep_ms)
        baseline.ms = min(baseline.ms or first, first)
    del kept
    times = {row.impl: row.ms for row in rows}
    for row in rows:
        row.baseline_ms, row.dot_scaled_ms = times.get(BASELINE), times.get("dot-scaled")
    return rows


def operand_formats(impls: Sequence[str]) -> dict[str, str]:
    """Each implementation's operand format: nvfp4 for the NVFP4 ones, mxfp4 for the others;
    cuBLAS bf16 (the baseline) takes MXFP4 unless every other one is NVFP4."""
    formats = {impl: "nvfp4" if impl in NVFP4_IMPLS else "mxfp4" for impl in impls}
    others = [formats[impl] for impl in impls if impl != BASELINE]
    if BASELINE in formats and others and all(name == "nvfp4" for name in others):
        formats[BASELINE] = "nvfp4"
    return formats


def _operands(
    shape: GemmShape, device: torch.device, spec: QuantSpec, outliers: Outliers | None = None
) -> tuple[QuantizedTensor, QuantizedTensor]:
    generator = torch.Generator(device=device).manual_seed(SEED)
    x = torch.randn(shape.m, shape.k, generator=generator, device=device, dtype=torch.bfloat16)
    w = torch.randn(shape.n, shape.k, generator=generator, device=device, dtype=torch.bfloat16)
    if outliers is not None:
        channels = outlier_channels(shape.k, outliers.channels, device)
        x[:, channels] *= outliers.scale
    return quantize(x, spec), quantize(w, spec)


def outlier_channels(k: int, count: int, device: torch.device) -> torch.Tensor:
    """`count` distinct channels of K, drawn by the benchmark's seed."""
    generator = torch.Generator(device=device).manual_seed(SEED + 1)
    return torch.randperm(k, generator=generator, device=device)[:count]


def _reference(a: QuantizedTensor, b: QuantizedTensor, name: str) -> torch.Tensor:
    """The float64 product the format defines, before any rounding to an output dtype."""
    if name == "mxfp4":
        return a.dequantize(torch.float64) @ b.dequantize(torch.float64).T
    from fp4cli.gemm.reference import block_scaled_values, nvfp4_alpha

    sums = block_scaled_values(a) @ block_scaled_values(b).T
    return nvfp4_alpha(a, b).to(torch.float64) * sums


def _measure(
    row: GemmRow,
    a: QuantizedTensor,
    b: QuantizedTensor,
    reference: torch.Tensor,
    device: torch.device,
    rep_ms: int,
) -> None:
    try:
        call, out = _call(row.impl, a, b, device)
        call()
        row.rel_error, row.beyond_rounding, row.max_error = _errors(out, reference)
        row.ms = _time_ms(call, device, rep_ms, row.timing)
    except (torch.OutOfMemoryError, MemoryError):  # before RuntimeError, its base
        row.note = "out of memory"
    except RuntimeError as error:
        note = capture_note(error) if row.timing == "graph" else None
        if note is None:
            raise
        row.note = note
    except _Unavailable as why:
        row.note = str(why)
    finally:
        _free(device)


class _Unavailable(Exception):
    """An implementation that does not run on this device."""


def _call(
    impl: str, a: QuantizedTensor, b: QuantizedTensor, device: torch.device
) -> tuple[Callable[[], object], torch.Tensor]:
    """A no-argument call running `impl` into its output tensor, and that tensor."""
    from fp4cli.gemm import mxfp4_matmul

    out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=device)
    if impl == "cublas-bf16":
        a_bf16, b_bf16 = a.dequantize(torch.bfloat16), b.dequantize(torch.bfloat16)
        return lambda: torch.matmul(a_bf16, b_bf16.T, out=out), out
    if impl == "cublas-fp8":
        return _cublas_fp8_call(a, b, out)
    if impl in ("exact", "fast"):
        _require_kernels(device)
        return lambda: mxfp4_matmul(a, b, mode=impl, backend="triton", out=out), out
    if impl in NVFP4_IMPLS:
        from fp4cli.gemm import nvfp4_matmul

        _require_kernels(device)
        variant = NVFP4_IMPLS[impl]
        return lambda: nvfp4_matmul(a, b, backend="triton", out=out, impl=variant), out
    return _kernel_call(impl, a, b, out, device), out


def _cublas_fp8_call(a: QuantizedTensor, b: QuantizedTensor, out: torch.Tensor):
    if out.device.type != "cuda" or torch.cuda.get_device_capability(out.device) < (8, 9):
        raise _Unavailable("needs a GPU with FP8 tensor cores")
    operands = []
    for q in (a, b):
        values = q.dequantize(torch.float32)
        scale = values.abs().amax() / 448.0  # E4M3's largest
        operands.append(((values / scale).to(torch.float8_e4m3fn), scale.reshape(())))
    (a8, scale_a), (b8, scale_b) = operands
    return lambda: torch._scaled_mm(
        a8, b8.T, scale_a, scale_b, out_dtype=torch.bfloat16, out=out
    ), out


def _kernel_call(
    impl: str, a: QuantizedTensor, b: QuantizedTensor, out: torch.Tensor, device: torch.device
) -> Callable[[], object]:
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm import launch as gemm_launch

    _require_kernels(device)
    a_op, b_op = kernel_operand(a), kernel_operand(b)
    launchers: dict[str, Callable[[], object]] = {
        "dot-scaled": lambda: gemm_launch.scaled_dot_matmul(a_op, b_op, out),
        "exact-fp8": lambda: gemm_launch.fp8_matmul(a_op, b_op, out, exact=True),
        "fast-fp8": lambda: gemm_launch.fp8_matmul(a_op, b_op, out, exact=False),
        "exact-fused": lambda: gemm_launch.fp8_matmul(a_op, b_op, out, exact=True, fused=True),
        "fast-fused": lambda: gemm_launch.fp8_matmul(a_op, b_op, out, exact=False, fused=True),
    }
    direct = {"cublas-bf16", "cublas-fp8", "exact", "fast", *NVFP4_IMPLS}
    assert set(launchers) | direct == set(IMPLS)
    return launchers[impl]


def _require_kernels(device: torch.device) -> None:
    from fp4cli.quant.backend import interpreter_on, triton_available

    if not triton_available() or not (device.type == "cuda" or interpreter_on()):
        raise _Unavailable("needs triton and CUDA (or TRITON_INTERPRET=1)")


def _errors(out: torch.Tensor, reference: torch.Tensor) -> tuple[float, float, float]:
    """(relative error, relative error against the reference rounded to out's dtype, largest
    error over the reference's largest magnitude)."""
    norm = reference.norm().item()
    if norm == 0:
        return 0.0, 0.0, 0.0
    actual = out.double()
    rounded = reference.to(out.dtype).double()
    largest = (actual - reference).abs().max().item() / reference.abs().max().item()
    return (
        (actual - reference).norm().item() / norm,
        (actual - rounded).norm().item() / norm,
        largest,
    )


def _time_ms(call: Callable[[], object], device: torch.device, rep_ms: int, timing: str) -> float:
    if timing == "graph":
        return median_ms(call, device, GRAPH_CALLS, timing="graph")
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(call, warmup=max(rep_ms // 4, 1), rep=rep_ms, return_mode="median"))
    return median_ms(call, device, iters=1, warmup=0, repeats=3)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
