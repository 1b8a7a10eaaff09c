"""The quantization kernels measured against the device's copy bandwidth.

For each shape and config, in one process: a copy of the input (`dst.copy_(src)`), then each
kernel (quantize, fake-quantize, dequantize) on the Triton backend, and quantize and
fake-quantize on the PyTorch reference, eager and under torch.compile. A case that cannot run
(no Triton, out of memory, a compile that fails or runs past its time limit) gets a row whose
note says why.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4cli.bench.calls import SEED, kernel_call
from fp4cli.bench.configs import (
    ITERS_MAX,
    BenchConfig,
    BenchError,
    bench_configs,
    check_count,
    error_line,
)
from fp4cli.bench.parsing import check_device, dtype_name
from fp4cli.bench.timing import (
    TimeLimitExceeded,
    capture_note,
    check_timing,
    median_ms,
    time_limit,
)
from fp4cli.bench.traffic import (
    KERNELS,
    PAIR_AMAX_KERNEL,
    PAIR_DIRECTION_AMAX_KERNELS,
    PAIR_DIRECTION_KERNELS,
    PAIR_KERNEL,
    TWO_LEVEL_KERNELS,
    quant_traffic,
)
from fp4cli.quant.backend import interpreter_on, kernel_gap, triton_available

BACKENDS = ("triton", "torch", "compile")
REFERENCE_KERNELS = ("quantize", "fake-quantize")  # the reference is timed on these
COMPILE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Case:
    """One tensor and one quantizer configuration."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    axis: int
    config: BenchConfig

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    def describe(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "axis": self.axis,
            "config": self.config.name,
            "spec": self.config.describe(),
        }


@dataclass
class BenchRow:
    """One kernel on one backend for one case: its time, or the note saying why there is none."""

    case: Case
    kernel: str
    backend: str
    bytes_moved: int
    iters: int
    timing: str = "loop"  # calls issued from Python, or replayed from a CUDA graph
    ms: float | None = None
    note: str | None = None
    copy_gbps: float | None = None  # the copy bandwidth of the same case
    triton_ms: float | None = None  # the Triton kernel's time for the same case and kernel

    @property
    def gbps(self) -> float | None:
        return None if self.ms is None else self.bytes_moved / (self.ms * 1e6)

    @property
    def copy_ratio(self) -> float | None:
        gbps = self.gbps
        return None if gbps is None or not self.copy_gbps else gbps / self.copy_gbps

    @property
    def triton_speedup(self) -> float | None:
        """How many times faster the Triton kernel is (reference rows only)."""
        if self.backend not in ("torch", "compile") or self.kernel == "copy":
            return None
        return None if self.ms is None or not self.triton_ms else self.ms / self.triton_ms

    def stored_config(self) -> dict[str, Any]:
        row = {"kernel": self.kernel, "backend": self.backend, "iters": self.iters,
               "timing": self.timing}  # fmt: skip
        return {**self.case.describe(), **row, "bytes": self.bytes_moved}

    def measurements(self) -> list[tuple[str, float, str]]:
        """(name, value, unit) of what the store keeps for this row."""
        if self.gbps is None:
            return []
        measured = [("gbps", self.gbps, "GB/s")]
        if self.kernel != "copy" and self.copy_ratio is not None:
            measured.append(("copy_ratio", self.copy_ratio, "x"))
        return measured


def run_quantize_bench(
    shapes: Sequence[tuple[int, ...]],
    configs: Sequence[str],
    dtype: torch.dtype = torch.bfloat16,
    axis: int = -1,
    backends: Sequence[str] = BACKENDS,
    iters: int = 20,
    device: torch.device | str = "auto",
    *,
    warmup: int = 2,
    repeats: int = 5,
    timing: str = "loop",
    compile_timeout_s: float = COMPILE_TIMEOUT_S,
    on_case: Callable[[int, Case], None] | None = None,
    on_rows: Callable[[list[BenchRow]], None] | None = None,
    pair_directions: bool = False,
) -> list[BenchRow]:
    """Measure every shape x config; `on_case(index, case)` is called before each case and
    `on_rows(rows)` with each case's rows as soon as they are measured (to store them then).
    `pair_directions`: a 2-D case also times each direction of its pair alone
    (`PAIR_DIRECTION_KERNELS`).

    A torch.compile that takes longer than `compile_timeout_s` (warm-up and timing included) is
    given up, and that config's kernel is not compiled again at the later shapes. timing
    "graph" times each call from a CUDA graph of `iters` calls (the GPU's time, without the
    Python dispatch that "loop" includes); a call that cannot be captured gets a note."""
    torch_device = bench_device(device)
    check_request(shapes, axis, backends, iters, torch_device, timing, pair_directions)
    runner = _Runner(torch_device, iters, warmup, repeats, backends, compile_timeout_s, timing,
                     pair_directions)  # fmt: skip
    cases = [Case(shape, dtype, axis, c) for shape in shapes for c in bench_configs(configs)]
    rows: list[BenchRow] = []
    for index, case in enumerate(cases):
        if on_case is not None:
            on_case(index, case)
        case_rows = runner.case_rows(case)
        if on_rows is not None:
            on_rows(case_rows)
        rows += case_rows
    return rows


def bench_device(device: torch.device | str) -> torch.device:
    """A torch device from auto, cpu, cuda or cuda:N."""
    if isinstance(device, torch.device):
        return device
    from fp4cli.train.loop import pick_device

    return pick_device(check_device(device))


INTERPRETED_NOTICE = (
    "TRITON_INTERPRET=1 on the CPU: each triton row is one call in Triton's interpreter "
    "(seconds each), which times the interpreter, not the kernels"
)


def interpreted(backend: str, device: torch.device) -> bool:
    """Whether `backend`'s rows run in Triton's interpreter (on the CPU, seconds a call): such
    a row is one call, its time the interpreter's, not a kernel's (`INTERPRETED_NOTICE`)."""
    return backend == "triton" and device.type != "cuda" and interpreter_on()


CPU_MAX_ELEMENTS = 1 << 22  # larger tensors take minutes per case on a CPU


def check_request(
    shapes: Sequence[tuple[int, ...]],
    axis: int,
    backends: Sequence[str],
    iters: int,
    device: torch.device | None = None,
    timing: str = "loop",
    pair_directions: bool = False,
) -> None:
    """Raise BenchError for a request that cannot run (or would run for many minutes on a
    CPU), or whose `pair_directions` would time nothing."""
    check_count("iters", iters, ITERS_MAX)
    if pair_directions and "triton" not in backends:
        raise BenchError("--pair-directions times the Triton kernels: add triton to --backends")
    if pair_directions and not any(len(shape) == 2 for shape in shapes):
        raise BenchError("--pair-directions times 2-D tensors: give a shape such as 8192x3072")
    check_timing(timing, device)
    if device is not None and device.type != "cuda":
        for shape in shapes:
            if math.prod(shape) > CPU_MAX_ELEMENTS:
                raise BenchError(
                    f"shape {'x'.join(map(str, shape))} is too large to measure on the CPU "
                    "(up to 2048x2048 here); give --shapes, or run on a GPU"
                )
    for backend in backends:
        if backend not in BACKENDS:
            raise BenchError(f"backends: {backend!r} is not one of {', '.join(BACKENDS)}")
    for shape in shapes:
        if not -len(shape) <= axis < len(shape):
            raise BenchError(f"axis {axis} is out of range for shape {'x'.join(map(str, shape))}")


@dataclass
class _Runner:
    """Measures cases one after another; remembers the compiles it gave up on."""

    device: torch.device
    iters: int
    warmup: int
    repeats: int
    backends: Sequence[str]
    compile_timeout_s: float
    timing: str
    pair_directions: bool = False
    gave_up: dict[tuple[str, str], str] = field(default_factory=dict)  # (config, kernel): why

    def case_rows(self, case: Case) -> list[BenchRow]:
        """The copy row, then each kernel's rows (Triton first) for one case."""
        traffic = quant_traffic(case.shape, case.dtype, case.axis, case.config)
        generator = torch.Generator(device=self.device).manual_seed(SEED)
        x = torch.randn(case.shape, generator=generator, device=self.device, dtype=case.dtype)
        copy = self.row(case, "copy", "torch", traffic.kernel_bytes("copy"))
        self.measure(copy, x)
        copy.copy_gbps = copy.gbps
        rows = [copy]
        kernels: tuple[str, ...] = KERNELS[1:]
        if case.config.spec.whole_tensor_scale:
            kernels += TWO_LEVEL_KERNELS
        if len(case.shape) == 2:
            kernels += (PAIR_KERNEL,) + (PAIR_DIRECTION_KERNELS if self.pair_directions else ())
            if case.config.spec.whole_tensor_scale:
                kernels += (PAIR_AMAX_KERNEL,)
                kernels += PAIR_DIRECTION_AMAX_KERNELS if self.pair_directions else ()
        for kernel in kernels:
            kernel_rows = [
                self.row(case, kernel, backend, traffic.kernel_bytes(kernel))
                for backend in self.backends
                if backend == "triton" or kernel in REFERENCE_KERNELS
            ]
            for row in kernel_rows:
                row.copy_gbps = copy.gbps
                self.measure(row, x)
            triton_ms = next((row.ms for row in kernel_rows if row.backend == "triton"), None)
            for row in kernel_rows:
                row.triton_ms = triton_ms
            rows += kernel_rows
        del x
        _free_memory(self.device, compiled="compile" in self.backends)
        return rows

    def row(self, case: Case, kernel: str, backend: str, bytes_moved: int) -> BenchRow:
        iters = 1 if interpreted(backend, self.device) else self.iters
        return BenchRow(case, kernel, backend, bytes_moved, iters, self.timing)

    def measure(self, row: BenchRow, x: torch.Tensor) -> None:
        """Time the row's call, or note why it cannot run."""
        row.note = self._skip_reason(row)
        if row.note is not None:
            return
        try:
            row.ms = self._time_ms(row, x)
        except (Exception, TimeLimitExceeded) as error:
            note = _failure_note(row.backend, error, self.timing)
            if note is None:
                raise
            row.note = note
            if _caused_by(error, TimeLimitExceeded):
                why = f"not compiled: timed out at {row.case.shape_text}"
                self.gave_up[(row.case.config.name, row.kernel)] = why
            _free_memory(self.device, compiled=False)

    def _skip_reason(self, row: BenchRow) -> str | None:
        if row.backend == "triton":
            return _triton_gap(row.case, self.device)
        if row.backend == "compile":
            return self.gave_up.get((row.case.config.name, row.kernel))
        return None

    def _time_ms(self, row: BenchRow, x: torch.Tensor) -> float:
        call = kernel_call(row.kernel, row.backend, x, row.case.config, row.case.axis)
        limit = self.compile_timeout_s if row.backend == "compile" else 0.0
        once = interpreted(row.backend, self.device)
        warmup, repeats = (0, 1) if once else (self.warmup, self.repeats)
        with time_limit(limit):
            return median_ms(call, self.device, row.iters, warmup, repeats, self.timing)


def _triton_gap(case: Case, device: torch.device) -> str | None:
    if not triton_available():
        return "needs triton"
    if device.type != "cuda" and not interpreter_on():
        return "needs CUDA or TRITON_INTERPRET=1"
    gap = kernel_gap(case.config.spec, case.dtype)
    return None if gap is None else f"kernels do not cover {gap}"


def _failure_note(backend: str, error: BaseException, timing: str = "loop") -> str | None:
    """The note for a failed measurement that is recorded rather than raised, else None."""
    if _caused_by(error, TimeLimitExceeded):
        return f"compile timed out ({_caused_by(error, TimeLimitExceeded)})"
    if _caused_by(error, torch.OutOfMemoryError) or _caused_by(error, MemoryError):
        return "out of memory"
    if timing == "graph" and (refused := capture_note(error)) is not None:
        return refused
    if backend == "compile":
        return f"compile failed: {error_line(error)}"
    return None


def _caused_by(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of `kind` in the chain of causes and contexts of `error`."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _free_memory(device: torch.device, compiled: bool) -> None:
    if compiled:
        torch._dynamo.reset()  # compiled graphs of this case are not reused
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
