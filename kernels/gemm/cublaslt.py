"""cuBLASLt's GEMM with its scale read from device memory:

    out = out_dtype(fl32(alpha * (a @ b^T)))

for 16-bit operands a (M, K) and b (N, K), float32 products summed in float32 and alpha a
float32 scalar on the GPU. torch's GEMMs take alpha from the host only, which would need a
host synchronization to read it; cuBLASLt's pointer mode "device" reads it when the kernel
runs, so a CUDA graph replays it with each step's alpha, and the scaling happens in the GEMM's
epilogue instead of a pass over a float32 result.

Only tiled algorithms without a split of K run: a split whose parts each pass through the
epilogue would scale every part by alpha and round each (reduction scheme "none" only), and
an algorithm of no defined tile (cuBLASLt's choice for some problems of a few rows, measured on
an H100 at 6 x 5 x 64) gave sums exact with alpha = 1 and results one float32 step away from
fl32(alpha * sum) with another alpha. The library is the one torch loaded
(`libcublasLt.so.*`), called through ctypes; `alpha_matmul` returns False where it cannot run
(no CUDA, another dtype or layout, no library, no tiled algorithm), and the caller then runs
its own route.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import torch

from fp4cli.replay import host_step

LIBRARY_NAMES = ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
# No workspace: without a split of K the tiled algorithms need none, and the NVFP4 GEMM ran as
# fast with none as with 32 MiB (H100, 8192^3 and Llama-7B's shapes); none keeps the peak
# memory where it was.
WORKSPACE_BYTES = 0

# Enumerations of cublasLt.h, cublas_api.h and library_types.h.
COMPUTE_32F = 68
DATA_TYPES = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 14}
OP_N, OP_T = 0, 1
DESC_POINTER_MODE, DESC_TRANSA, DESC_TRANSB = 2, 3, 4
POINTER_MODE_DEVICE = 1
PREF_MAX_WORKSPACE_BYTES, PREF_REDUCTION_SCHEME_MASK = 1, 3
PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
REDUCTION_SCHEME_NONE = 0
DESC_EPILOGUE, DESC_BIAS_POINTER, EPILOGUE_BIAS = 7, 8, 4
ALGO_CONFIG_TILE_ID, TILE_UNDEFINED = 1, 0
CANDIDATES = 8  # heuristic results read, best first


class _Heuristic(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves_count", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


_P, _I, _SIZE = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
SIGNATURES = {  # argument types of each function called, as cublasLt.h declares them
    "cublasLtCreate": [_P],
    "cublasLtMatmulDescCreate": [_P, _I, _I],
    "cublasLtMatmulDescSetAttribute": [_P, _I, _P, _SIZE],
    "cublasLtMatrixLayoutCreate": [_P, _I, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
    "cublasLtMatmulPreferenceCreate": [_P],
    "cublasLtMatmulPreferenceSetAttribute": [_P, _I, _P, _SIZE],
    "cublasLtMatmulPreferenceDestroy": [_P],
    "cublasLtMatmulAlgoGetHeuristic": [_P] * 7 + [_I, ctypes.POINTER(_Heuristic), _P],
    "cublasLtMatmulAlgoConfigGetAttribute": [_P, _I, _P, _SIZE, _P],
    "cublasLtMatmul": [_P] * 14 + [_SIZE, _P],
    "cublasLtGetStatusString": [_I],
}
STATUS_NOT_SUPPORTED = 15


@cache
def _library() -> Any:
    """The cuBLASLt library torch loaded (its functions typed), or None."""
    if torch.cuda.is_available():
        torch.cuda.current_blas_handle()  # makes torch load its cuBLAS first
    for name in LIBRARY_NAMES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        for function, argtypes in SIGNATURES.items():
            getattr(lib, function).argtypes = argtypes
        lib.cublasLtGetStatusString.restype = ctypes.c_char_p
        return lib
    return None


def _check(status: int, what: str) -> None:
    if status != 0:
        message = _library().cublasLtGetStatusString(status).decode()
        raise RuntimeError(f"cuBLASLt {what} failed: {message} (status {status})")


@cache
def _device_state(index: int) -> tuple[ctypes.c_void_p, torch.Tensor]:
    """(handle, a float32 zero for beta) of one GPU."""
    handle = ctypes.c_void_p()
    with torch.cuda.device(index):
        _check(_library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    zero = torch.zeros(1, dtype=torch.float32, device=f"cuda:{index}")
    return handle, zero


def _set(setter: Any, descriptor: ctypes.c_void_p, attribute: int, value: Any) -> None:
    _check(
        setter(descriptor, attribute, ctypes.byref(value), ctypes.sizeof(value)),
        f"setting attribute {attribute}",
    )


def descriptor(b_op: int, a_op: int, bias_alignment: int) -> ctypes.c_void_p:
    """A matmul descriptor: float32 compute and scale, alpha and beta on the device, the two
    operations, and the bias epilogue where `bias_alignment` (the bias pointer's) is not 0."""
    lib = _library()
    desc = ctypes.c_void_p()
    _check(
        lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, DATA_TYPES[torch.float32]),
        "cublasLtMatmulDescCreate",
    )
    setter = lib.cublasLtMatmulDescSetAttribute
    _set(setter, desc, DESC_POINTER_MODE, ctypes.c_int32(POINTER_MODE_DEVICE))
    _set(setter, desc, DESC_TRANSA, ctypes.c_int32(b_op))
    _set(setter, desc, DESC_TRANSB, ctypes.c_int32(a_op))
    if bias_alignment:
        _set(setter, desc, DESC_EPILOGUE, ctypes.c_uint32(EPILOGUE_BIAS))
        # the heuristic reads the bias pointer's alignment from its value
        _set(setter, desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias_alignment))
    return desc


def layout(dtype: torch.dtype, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
    """A column-major matrix layout."""
    result = ctypes.c_void_p()
    _check(
        _library().cublasLtMatrixLayoutCreate(
            ctypes.byref(result), DATA_TYPES[dtype], rows, cols, ld
        ),
        "cublasLtMatrixLayoutCreate",
    )
    return result


def preference(alignments: tuple[int, int, int, int]) -> ctypes.c_void_p:
    """Heuristic preferences: no workspace, no split of K, the pointers' alignments (A, B, C,
    D in bytes). The caller destroys it."""
    lib = _library()
    result = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(result)), "preference")
    pref_set = lib.cublasLtMatmulPreferenceSetAttribute
    _set(pref_set, result, PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES))
    _set(pref_set, result, PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(REDUCTION_SCHEME_NONE))
    for name, align in zip("abcd", alignments, strict=True):
        _set(pref_set, result, PREF_MIN_ALIGNMENT[name], ctypes.c_uint32(align))
    return result


def _alignment(pointer: int) -> int:
    return min(256, pointer & -pointer) if pointer else 256


class _Plan(NamedTuple):
    """cuBLASLt's objects for one problem: the matmul descriptor, the layouts of its first
    and second operands (b and a as stored) and of the result, and the algorithm."""

    descriptor: ctypes.c_void_p
    first: ctypes.c_void_p
    second: ctypes.c_void_p
    result: ctypes.c_void_p
    found: _Heuristic


@cache
def _plan(key: tuple) -> _Plan | None:
    """The plan of one problem, or None when cuBLASLt offers no tiled algorithm for it. Kept
    for the process."""
    (index, m, n, k, b_op, b_ld, a_op, a_ld, in_dtype, out_dtype, aligns, bias_align) = key
    desc = descriptor(b_op, a_op, bias_align)
    # column-major: D (N, M) = op(B') (N, K) op(A') (K, M), B' = b and A' = a as stored
    first = layout(in_dtype, *((k, n) if b_op == OP_T else (n, k)), b_ld)
    second = layout(in_dtype, *((k, m) if a_op == OP_N else (m, k)), a_ld)
    result = layout(out_dtype, n, m, n)
    prefs = preference(aligns)
    found, count = (_Heuristic * CANDIDATES)(), ctypes.c_int(0)
    lib = _library()
    _check(
        lib.cublasLtMatmulAlgoGetHeuristic(
            _device_state(index)[0], desc, first, second, result, result, prefs, CANDIDATES,
            found, ctypes.byref(count),
        ),
        "cublasLtMatmulAlgoGetHeuristic",
    )  # fmt: skip
    lib.cublasLtMatmulPreferenceDestroy(prefs)
    tiled = [h for h in found[: count.value] if h.state == 0 and _tile(h) != TILE_UNDEFINED]
    return _Plan(desc, first, second, result, tiled[0]) if tiled else None


def _tile(heuristic: _Heuristic) -> int:
    """The tile id of a heuristic result's algorithm."""
    tile, written = ctypes.c_uint32(TILE_UNDEFINED), ctypes.c_size_t(0)
    _check(
        _library().cublasLtMatmulAlgoConfigGetAttribute(
            ctypes.byref(heuristic.algo), ALGO_CONFIG_TILE_ID, ctypes.byref(tile),
            ctypes.sizeof(tile), ctypes.byref(written),
        ),
        "cublasLtMatmulAlgoConfigGetAttribute",
    )  # fmt: skip
    return tile.value


def _operand(t: torch.Tensor, rows: int, k: int, as_rows_op: int) -> tuple[int, int] | None:
    """(cuBLAS op, leading dimension) of a (rows, K) operand stored row- or column-major, or
    None for other strides. A row-major (rows, K) matrix is column-major (K, rows)."""
    if t.stride(1) == 1 and t.stride(0) >= max(k, 1):
        return as_rows_op, t.stride(0)
    if t.stride(0) == 1 and t.stride(1) >= max(rows, 1):
        return OP_N if as_rows_op == OP_T else OP_T, t.stride(1)
    return None


def _bias_fits(bias: torch.Tensor, n: int, out: torch.Tensor) -> bool:
    """Whether the epilogue takes this bias: (N,) on the output's device, of the output's dtype
    or a 16-bit one that widens exactly to a float32 output."""
    widens = out.dtype == torch.float32 and bias.dtype in (torch.bfloat16, torch.float16)
    return (
        bias.dim() == 1
        and bias.numel() == n
        and bias.device == out.device
        and (bias.dtype == out.dtype or widens)
    )


@dataclass(frozen=True)
class _Route:
    """What `alpha_matmul` decided for one call's layouts: cuBLASLt's plan, the GPU, and the
    alignments of the pointers (B, A, D, the bias or 0) that the plan was chosen for."""

    plan: _Plan
    index: int
    alignments: tuple[int, int, int, int]


def _takes(
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None,
) -> bool:
    """Whether the operands are of a kind cuBLASLt's route takes (`alpha_matmul`)."""
    m, k = a.shape
    n = b.shape[0]
    return (
        a.is_cuda
        and a.dtype in (torch.bfloat16, torch.float16)
        and b.dtype == a.dtype
        and out.dtype in (a.dtype, torch.float32)
        and out.is_contiguous()
        and alpha.dtype == torch.float32
        and alpha.numel() == 1
        and min(m, n, k) > 0
        and b.device == a.device == out.device == alpha.device
        and (bias is None or _bias_fits(bias, n, out))
        and _library() is not None
    )


def _alignments(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None
) -> tuple[int, int, int, int]:
    return (_alignment(b.data_ptr()), _alignment(a.data_ptr()), _alignment(out.data_ptr()),
            0 if bias is None else _alignment(bias.data_ptr()))  # fmt: skip


def _route(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None
) -> _Route | None:
    """The plan for operands `_takes` took (and a bias in the output's dtype), or None where
    cuBLASLt has none for them."""
    m, k = a.shape
    n = b.shape[0]
    first, second = _operand(b, n, k, OP_T), _operand(a, m, k, OP_N)
    if first is None or second is None:
        return None
    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    alignments = _alignments(a, b, out, bias)
    aligns = (*alignments[:3], alignments[2])  # A, B, C and D: C is D
    plan = _plan((index, m, n, k, *first, *second, a.dtype, out.dtype, aligns, alignments[3]))
    return None if plan is None else _Route(plan, index, alignments)


def _launch(
    route: _Route,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None,
) -> bool:
    """cuBLASLt's matmul on the route's plan; False where it launched nothing."""
    plan = route.plan
    lib = _library()
    if bias is not None:
        _set(
            lib.cublasLtMatmulDescSetAttribute,
            plan.descriptor,
            DESC_BIAS_POINTER,
            ctypes.c_void_p(bias.data_ptr()),
        )
    handle, zero = _device_state(route.index)
    status = lib.cublasLtMatmul(
        handle, plan.descriptor, alpha.data_ptr(), b.data_ptr(), plan.first, a.data_ptr(),
        plan.second, zero.data_ptr(), out.data_ptr(), plan.result, out.data_ptr(), plan.result,
        ctypes.byref(plan.found.algo),
        None, WORKSPACE_BYTES, torch._C._cuda_getCurrentRawStream(route.index),
    )  # fmt: skip
    if status == STATUS_NOT_SUPPORTED:  # nothing was launched
        return False
    _check(status, "cublasLtMatmul")
    return True


def _direct_alpha_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> bool:
    """`alpha_matmul` itself: every check, the plan looked up, the launch."""
    if not _takes(a, b, alpha, out, bias):
        return False
    if bias is not None:
        bias = bias.to(out.dtype).contiguous()  # exact: the same dtype, or a widening
    route = _route(a, b, out, bias)
    return route is not None and _launch(route, a, b, alpha, out, bias)


class _BoundMatmul:
    """A replay's `alpha_matmul`: the recorded call's plan launched again where the pointers
    have the recorded alignments, the whole function where they have not (as a direct call
    would, which looks the plan up by them). The operands' dtypes, shapes and strides are the
    recorded ones: a replay runs only on inputs of the recorded layouts."""

    def __init__(self, route: _Route, convert_bias: bool) -> None:
        self.route, self.convert_bias = route, convert_bias

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        alpha: torch.Tensor,
        out: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> bool:
        if bias is not None and self.convert_bias:
            bias = bias.to(out.dtype).contiguous()
        if _alignments(a, b, out, bias) != self.route.alignments:
            return _direct_alpha_matmul(a, b, alpha, out, bias)
        return _launch(self.route, a, b, alpha, out, bias)


def _bind(
    ran: bool,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> _BoundMatmul | None:
    """What a recording's replays call for a call that ran (`recorder.HostStepOptions`)."""
    if not ran:
        return None
    converted = None if bias is None else bias.to(out.dtype).contiguous()
    route = _route(a, b, out, converted)
    if route is None:
        return None
    return _BoundMatmul(route, bias is not None and converted is not bias)


@host_step(bind=_bind, graphable=True)
def alpha_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> bool:
    """out = out.dtype(fl32(alpha * (a @ b^T)) (+ bias, in float32)) for CUDA tensors a (M, K)
    and b (N, K) of one 16-bit dtype (row- or column-major), alpha a (1,) float32 tensor, out a
    contiguous (M, N) tensor of the operands' dtype or float32 and an optional (N,) bias of the
    output's dtype or a 16-bit one. Returns whether it ran: False, having done nothing, where
    cuBLASLt cannot take it. One step of a recording (`fp4cli.replay`): a replay calls the
    recorded call's plan again (`_BoundMatmul`), checks that it ran as the recorded call did,
    and a CUDA graph of the program may hold it."""
    return _direct_alpha_matmul(a, b, alpha, out, bias)
