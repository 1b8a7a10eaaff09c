"""Python side of the MXFP4 GEMM kernels: operands, per-row preparation, tiles and launches.

Every launcher computes out = dequantize(A) @ dequantize(B)^T into a given `out` and returns it:

- `exact_matmul`: the float32 accumulation of the exact products, in up to three tiers chosen
  per output tile by its rows' scale spread (`gemm_prep` flags): INT8 tensor cores (rows within
  4 binades, exact int32 sums), FP8 tensor cores (within 27; promotion every 32) and the
  per-window FP8 kernel (wider).
- `exact_fp8_matmul`: the same without the INT8 tier (FP8 and per-window only).
- `fast_cublas_matmul`: cuBLAS's FP8 GEMM with row-wise scales on E4M3-folded operands.
- `fast_fp8_matmul`: the FP8 kernel with promotion every BK, blocks beyond 26 binades flushed.
- `scaled_dot_matmul`: Triton's `tl.dot_scaled` (native MXFP4 on Blackwell).
- `weight_only_matmul`: a float A against a quantized B.

The launchers run eagerly under torch.compile, like the quantization kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from fp4cli.kernels.gemm_fp8 import mxfp4_fp8_gemm_kernel
from fp4cli.kernels.gemm_int8 import mxfp4_int8_gemm_kernel
from fp4cli.kernels.gemm_prep import row_prep_kernel
from fp4cli.kernels.gemm_scaled import scaled_dot_kernel, weight_only_kernel
from fp4cli.kernels.gemm_window import mxfp4_window_gemm_kernel
from fp4cli.quant.backend import interpreter_on

PREP_ROWS = 4
PREP_WORDS = 64  # code words (8 codes each) per row and step of the preparation kernel
PREP_SCALE_CHUNK = 64
PREP_WARPS = 4


@dataclass(frozen=True)
class Operand:
    """One GEMM operand blocked along K: (rows, K_padded / 2) packed E2M1 codes and
    (rows, K_padded / block) E8M0 scale codes, both contiguous."""

    codes: torch.Tensor
    scales: torch.Tensor
    block: int

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    @property
    def k_padded(self) -> int:
        return self.codes.shape[1] * 2


@dataclass(frozen=True)
class Prepared:
    """What `prepare` computes for an operand: each row's reference scale code and flags
    (`gemm_prep`), and the staged copies asked for, each (rows, K_padded)."""

    ref: torch.Tensor
    flags: torch.Tensor
    int8: torch.Tensor | None = None
    e5m2: torch.Tensor | None = None
    e4m3: torch.Tensor | None = None
    e4m3_scale: torch.Tensor | None = None  # (rows,) float32: 2^(ref - 133), NaN rows NaN


@dataclass(frozen=True)
class GemmTile:
    """A GEMM program's tile (BM x BN, BK along K per step), warps, pipeline stages, and how many
    row tiles share one sweep over B's tiles."""

    bm: int
    bn: int
    bk: int
    warps: int = 8
    stages: int = 3
    group_m: int = 8


INTERPRETER_TILE = GemmTile(32, 32, 64, 4, 1, 4)
INT8_TILE = GemmTile(128, 256, 128, 8, 4)
FP8_EXACT_TILE = GemmTile(128, 128, 64, 4, 5)
FP8_FAST_TILE = GemmTile(256, 128, 128, 8, 3)
WINDOW_TILE = GemmTile(128, 128, 32, 8, 3)
SCALED_DOT_TILE = GemmTile(128, 256, 128, 8, 3)
WEIGHT_ONLY_TILE = GemmTile(128, 128, 64, 8, 4)


def _tile(tile: GemmTile | None, default: GemmTile) -> GemmTile:
    if tile is not None:
        return tile
    return INTERPRETER_TILE if interpreter_on() else default


def _grid(rows_a: int, rows_b: int, tile: GemmTile) -> tuple[int]:
    return (triton.cdiv(rows_a, tile.bm) * triton.cdiv(rows_b, tile.bn),)


@torch.compiler.disable
def prepare(operand: Operand, int8: bool = False, e5m2: bool = False, e4m3: bool = False):
    """Each row's reference scale and flags, and the staged copies asked for."""
    rows, k_padded, device = operand.rows, operand.k_padded, operand.codes.device
    ref = torch.empty(rows, dtype=torch.int32, device=device)
    flags = torch.empty(rows, dtype=torch.int32, device=device)

    def staged(wanted: bool) -> torch.Tensor | None:
        return torch.empty(rows, k_padded, dtype=torch.uint8, device=device) if wanted else None

    int8_out, e5m2_out, e4m3_out = staged(int8), staged(e5m2), staged(e4m3)
    e4m3_scale = torch.empty(rows, dtype=torch.float32, device=device) if e4m3 else None
    row_prep_kernel[(triton.cdiv(rows, PREP_ROWS),)](
        operand.codes.view(torch.int32), operand.scales,
        *(_words(out, ref) for out in (int8_out, e5m2_out, e4m3_out)),
        e4m3_scale if e4m3_scale is not None else ref, ref, flags, rows, k_padded,
        ROWS=PREP_ROWS, WORDS=PREP_WORDS, SCALE_CHUNK=PREP_SCALE_CHUNK, BLOCK=operand.block,
        WRITE_INT8=int8, WRITE_E5M2=e5m2, WRITE_E4M3=e4m3, num_warps=PREP_WARPS,
    )  # fmt: skip
    return Prepared(
        ref,
        flags,
        int8_out.view(torch.int8) if int8_out is not None else None,
        e5m2_out.view(torch.float8_e5m2) if e5m2_out is not None else None,
        e4m3_out.view(torch.float8_e4m3fn) if e4m3_out is not None else None,
        e4m3_scale,
    )


def _words(out: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """A staged output as int32 words, or a stand-in pointer the kernel never writes."""
    return out.view(torch.int32) if out is not None else stand_in


@torch.compiler.disable
def exact_matmul(a: Operand, b: Operand, out: torch.Tensor) -> torch.Tensor:
    """Exact, in three tiers by the spread of each tile's rows: INT8, FP8 and per window."""
    prep_a = prepare(a, int8=True, e5m2=True)
    prep_b = prepare(b, int8=True, e5m2=True)
    launch_int8(prep_a, prep_b, out)
    launch_fp8(a, b, prep_a, prep_b, out, exact=True, skip_narrow=True)
    return launch_window(a, b, prep_a, prep_b, out)


@torch.compiler.disable
def exact_fp8_matmul(
    a: Operand, b: Operand, out: torch.Tensor, fused: bool = False, tile: GemmTile | None = None
) -> torch.Tensor:
    """Exact on FP8 tensor cores only (no INT8 tier): E5M2 staged in memory, or decoded in
    registers (`fused`)."""
    prep_a, prep_b = prepare(a, e5m2=not fused), prepare(b, e5m2=not fused)
    launch_fp8(a, b, prep_a, prep_b, out, exact=True, tile=tile)
    return launch_window(a, b, prep_a, prep_b, out)


@torch.compiler.disable
def fast_fp8_matmul(
    a: Operand, b: Operand, out: torch.Tensor, fused: bool = False, tile: GemmTile | None = None
) -> torch.Tensor:
    """Fast on the FP8 kernel: promotion every BK, blocks beyond 26 binades flushed."""
    prep_a, prep_b = prepare(a, e5m2=not fused), prepare(b, e5m2=not fused)
    return launch_fp8(a, b, prep_a, prep_b, out, exact=False, tile=tile)


def cublas_fast_supported(a: Operand, b: Operand, out: torch.Tensor) -> bool:
    """Whether `fast_cublas_matmul` can run: a CUDA device with FP8 tensor cores, a contiguous
    bf16 output and sizes cuBLAS's FP8 GEMM takes."""
    if out.device.type != "cuda" or interpreter_on():
        return False
    major, minor = torch.cuda.get_device_capability(out.device)
    return (
        (major, minor) >= (8, 9)
        and out.dtype == torch.bfloat16
        and out.is_contiguous()
        and b.rows % 16 == 0
        and a.k_padded % 16 == 0
    )


@torch.compiler.disable
def fast_cublas_matmul(a: Operand, b: Operand, out: torch.Tensor) -> torch.Tensor:
    """Fast, through cuBLAS's FP8 GEMM with row-wise scales (`torch._scaled_mm`): each operand
    folded to E4M3 against its rows' largest scale (blocks more than 11 binades below flushed),
    the rows' scales applied in cuBLAS's epilogue. Needs `cublas_fast_supported`."""
    prep_a, prep_b = prepare(a, e4m3=True), prepare(b, e4m3=True)
    assert prep_a.e4m3 is not None and prep_b.e4m3 is not None
    assert prep_a.e4m3_scale is not None and prep_b.e4m3_scale is not None
    scale_a, scale_b = prep_a.e4m3_scale.unsqueeze(1), prep_b.e4m3_scale.unsqueeze(0)
    return torch._scaled_mm(
        prep_a.e4m3, prep_b.e4m3.T, scale_a, scale_b, out_dtype=torch.bfloat16, out=out
    )


@torch.compiler.disable
def launch_int8(
    prep_a: Prepared, prep_b: Prepared, out: torch.Tensor, tile: GemmTile | None = None
) -> torch.Tensor:
    """The INT8 kernel on INT8-staged operands; tiles with a row beyond INT8's range are left
    unwritten."""
    assert prep_a.int8 is not None and prep_b.int8 is not None
    tile = _tile(tile, INT8_TILE)
    (rows_a, k_padded), rows_b = prep_a.int8.shape, prep_b.int8.shape[0]
    mxfp4_int8_gemm_kernel[_grid(rows_a, rows_b, tile)](
        prep_a.int8, prep_a.ref, prep_a.flags, prep_b.int8, prep_b.ref, prep_b.flags,
        out, rows_a, rows_b, k_padded, out.stride(0), out.stride(1),
        BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m,
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


@torch.compiler.disable
def launch_fp8(
    a: Operand,
    b: Operand,
    prep_a: Prepared,
    prep_b: Prepared,
    out: torch.Tensor,
    exact: bool,
    skip_narrow: bool = False,
    tile: GemmTile | None = None,
) -> torch.Tensor:
    """The FP8 kernel, on E5M2-staged operands or (none staged) decoding in registers. Exact:
    tiles beyond E5M2's range are left unwritten (and with `skip_narrow` those within INT8's)."""
    tile = _tile(tile, FP8_EXACT_TILE if exact else FP8_FAST_TILE)
    fused = prep_a.e5m2 is None
    mxfp4_fp8_gemm_kernel[_grid(a.rows, b.rows, tile)](
        a.codes, a.scales, _bytes(prep_a.e5m2, a), prep_a.ref, prep_a.flags,
        b.codes, b.scales, _bytes(prep_b.e5m2, b), prep_b.ref, prep_b.flags,
        out, a.rows, b.rows, a.k_padded, out.stride(0), out.stride(1),
        BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m, BLOCK=a.block,
        FUSED=fused, EXACT=exact, SKIP_NARROW=skip_narrow,
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


def _bytes(staged: torch.Tensor | None, operand: Operand) -> torch.Tensor:
    """A staged operand as bytes, or (decoded in registers: never read) the codes."""
    return staged.view(torch.uint8) if staged is not None else operand.codes


@torch.compiler.disable
def launch_window(
    a: Operand,
    b: Operand,
    prep_a: Prepared,
    prep_b: Prepared,
    out: torch.Tensor,
    tile: GemmTile | None = None,
) -> torch.Tensor:
    """The per-window kernel: only tiles with a row beyond E5M2's range are written."""
    tile = _tile(tile, WINDOW_TILE)
    mxfp4_window_gemm_kernel[_grid(a.rows, b.rows, tile)](
        a.codes, a.scales, prep_a.flags, b.codes, b.scales, prep_b.flags,
        out, a.rows, b.rows, a.k_padded, out.stride(0), out.stride(1),
        BM=tile.bm, BN=tile.bn, GROUP_M=tile.group_m, BLOCK=a.block,
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


@torch.compiler.disable
def scaled_dot_matmul(
    a: Operand, b: Operand, out: torch.Tensor, tile: GemmTile | None = None
) -> torch.Tensor:
    """Through Triton's `tl.dot_scaled` (e2m1 x e2m1, block 32): the native MXFP4 MMA on
    Blackwell, a bf16 emulation elsewhere."""
    tile = _tile(tile, SCALED_DOT_TILE)
    scaled_dot_kernel[_grid(a.rows, b.rows, tile)](
        a.codes, a.scales, b.codes, b.scales, out, a.rows, b.rows, a.k_padded,
        out.stride(0), out.stride(1),
        BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m,
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


@torch.compiler.disable
def weight_only_matmul(
    a: torch.Tensor, b: Operand, out: torch.Tensor, tile: GemmTile | None = None
) -> torch.Tensor:
    """out = a @ dequantize(b)^T for a float a (M, K): B decoded in registers to a's dtype
    (exact: an E2M1 value times an E8M0 scale is a bfloat16 number) and multiplied on the
    tensor cores in that dtype with float32 accumulation."""
    tile = _tile(tile, WEIGHT_ONLY_TILE)
    a = a.contiguous()
    weight_only_kernel[_grid(a.shape[0], b.rows, tile)](
        a, b.codes, b.scales, out, a.shape[0], b.rows, a.shape[1], b.k_padded,
        out.stride(0), out.stride(1),
        BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m, BLOCK=b.block,
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out
