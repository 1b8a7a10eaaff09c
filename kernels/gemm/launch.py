"""Python side of the MXFP4 GEMM kernels: operands, per-row preparation, tiles and launches.

Every launcher computes out = dequantize(A) @ dequantize(B)^T (+ bias, an optional (N,) tensor
added to the float32 sums before their one rounding, as cuBLAS's epilogue adds it) into a given
`out` and returns it:

- `exact_matmul`: the float32 accumulation of the exact products, in up to three tiers chosen
  per output tile by its rows' scale spread (`gemm.prep` flags): INT8 tensor cores (rows within
  4 binades over K's INT8 segment, exact int32 sums; the few outlier windows of K split off to
  FP8 in the same program, `gemm.split`), FP8 tensor cores (within 27; promotion every 32) and
  per-window FP8 (wider), the last two in one kernel.
- `fp8_matmul(exact=True)`: the same without the INT8 tier (FP8 and per-window only).
- `fast_cublas_matmul`: cuBLAS's FP8 GEMM with row-wise scales on E4M3-folded operands.
- `fp8_matmul(exact=False)`: the FP8 kernel with promotion every BK, blocks beyond 26 binades
  flushed.
- `scaled_dot_matmul`: Triton's `tl.dot_scaled` (native MXFP4 on Blackwell).
- `weight_only_matmul`: a float A against a quantized B.

The launchers run eagerly under torch.compile, like the quantization kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from fp4cli.kernels.gemm.fp8 import mxfp4_fp8_gemm_kernel
from fp4cli.kernels.gemm.int8 import mxfp4_int8_gemm_kernel
from fp4cli.kernels.gemm.prep import operand_prep_kernel
from fp4cli.kernels.gemm.scaled import scaled_dot_kernel, weight_only_kernel
from fp4cli.kernels.gemm.split import KSplit, k_split
from fp4cli.kernels.host.launch import launch
from fp4cli.quant.backend import interpreter_on

STAGED_DTYPES = {"int8": torch.int8, "e5m2": torch.float8_e5m2, "e4m3": torch.float8_e4m3fn}
# the preparation kernel's programs: (rows, code words of 8 codes per row and step), writing
# at most one staged format by the step that divides a row's words (no masked half steps: 96
# words at K = 768, 288 at 2304), or more formats
PREP_SHAPES = {32: (16, 32), 64: (8, 64), 128: (8, 128)}
PREP_SHAPE_FORMATS = (4, 64)
# under the interpreter, which pays for every operation of every program, 32 rows a program
INTERPRETER_PREP_ROWS = 32
PREP_SCALE_CHUNK = 64
PREP_WARPS = 4
# Triton's `maxnreg` for the preparation kernel: with it, Triton 3.6 gives the kernel 48-55
# registers a thread where it chose 40-47, and the weight gradient's long rows run 13-22% faster
PREP_MAX_REGISTERS: int | None = 80


@dataclass(frozen=True)
class PackedRows:
    """(rows, K_padded / 2) packed E2M1 codes, two to a byte, blocked along K."""

    codes: torch.Tensor

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    @property
    def k_padded(self) -> int:
        return self.codes.shape[1] * 2


@dataclass(frozen=True)
class Operand(PackedRows):
    """One GEMM operand blocked along K: packed codes and (rows, K_padded / block) E8M0 scale
    codes, both contiguous."""

    scales: torch.Tensor
    block: int


@dataclass(frozen=True)
class Prepared:
    """What `prepare` computes for a pair of operands (`gemm.prep`): facts (3, M + N) int32 (each
    row's reference scale code, flags, and its INT8 segment's reference; A's rows first), per
    staged format the (A, B) pair of (rows, K_padded) tensors asked for, E4M3 row scales (A's
    (M,), B's (N,)), and the K split the staged copies follow, if any."""

    facts: torch.Tensor
    int8: tuple[torch.Tensor, torch.Tensor] | None = None
    e5m2: tuple[torch.Tensor, torch.Tensor] | None = None
    e4m3: tuple[torch.Tensor, torch.Tensor] | None = None
    e4m3_scales: tuple[torch.Tensor, torch.Tensor] | None = None
    split: KSplit | None = None

    def flags(self, rows_a: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(A's flags, B's flags)."""
        return self.facts[1, :rows_a], self.facts[1, rows_a:]


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
INT8_TILE = GemmTile(256, 128, 128, 8, 4)
FP8_EXACT_TILE = GemmTile(128, 128, 64, 4, 5)
FP8_FAST_TILE = GemmTile(256, 128, 128, 8, 3)
SCALED_DOT_TILE = GemmTile(128, 256, 128, 8, 3)
WEIGHT_ONLY_TILE = GemmTile(128, 128, 64, 8, 4)


def _tile(tile: GemmTile | None, default: GemmTile) -> GemmTile:
    if tile is not None:
        return tile
    return INTERPRETER_TILE if interpreter_on() else default


def _grid(rows_a: int, rows_b: int, tile: GemmTile) -> tuple[int]:
    return (triton.cdiv(rows_a, tile.bm) * triton.cdiv(rows_b, tile.bn),)


@torch.compiler.disable
def prepare(
    a: Operand,
    b: Operand,
    int8: bool = False,
    e5m2: bool = False,
    e4m3: bool = False,
    tier_flags: bool = False,
    split: KSplit | None = None,
) -> Prepared:
    """Both operands' facts and the staged copies asked for, in one launch; the flags of the
    exact GEMM's tiers (2, 4) only with `tier_flags`; the staged windows in `split`'s order."""
    rows_a, rows_b, k_padded = a.rows, b.rows, a.k_padded
    rows, device = rows_a + rows_b, a.codes.device
    formats = [name for name, wanted in (("int8", int8), ("e5m2", e5m2), ("e4m3", e4m3)) if wanted]
    facts = torch.empty(3, rows, dtype=torch.int32, device=device)
    # with no staged format the kernel writes none: a one-word stand-in for the pointer
    staged_shape = (len(formats), rows, k_padded) if formats else (1, 1, 4)
    staged = torch.empty(staged_shape, dtype=torch.uint8, device=device)
    scales = torch.empty(rows if e4m3 else 1, dtype=torch.float32, device=device)
    rows_per_program, words = _prep_shape(k_padded, len(formats))
    programs = triton.cdiv(rows_a, rows_per_program) + triton.cdiv(rows_b, rows_per_program)
    launch(
        operand_prep_kernel, (programs,),
        (a.codes.view(torch.int32), a.scales, b.codes.view(torch.int32), b.scales,
         staged.view(torch.int32), facts, scales, *_split_pointers(split, facts), rows_a, rows_b,
         k_padded),
        dict(ROWS=rows_per_program, WORDS=words, SCALE_CHUNK=PREP_SCALE_CHUNK,
             BLOCK=a.block, WRITE_INT8=int8, WRITE_E5M2=e5m2, WRITE_E4M3=e4m3,
             TIER_FLAGS=tier_flags, SPLIT=split is not None),
        num_warps=PREP_WARPS, **_register_cap(PREP_MAX_REGISTERS),
    )  # fmt: skip
    pairs = {
        name: (part[:rows_a].view(STAGED_DTYPES[name]), part[rows_a:].view(STAGED_DTYPES[name]))
        for name, part in zip(formats, staged, strict=False)
    }
    scale_pair = (scales[:rows_a], scales[rows_a:]) if e4m3 else None
    return Prepared(
        facts, pairs.get("int8"), pairs.get("e5m2"), pairs.get("e4m3"), scale_pair, split
    )


def _register_cap(registers: int | None) -> dict[str, int]:
    """Triton's `maxnreg` launch option for a GPU launch, or nothing."""
    return {} if registers is None or interpreter_on() else {"maxnreg": registers}


def _prep_shape(k_padded: int, formats: int) -> tuple[int, int]:
    """(rows, words) of a preparation program (`PREP_SHAPES`) for rows of k_padded codes."""
    rows, words = PREP_SHAPE_FORMATS
    if formats <= 1:
        rows, words = PREP_SHAPES[next((w for w in (128, 64) if (k_padded // 8) % w == 0), 32)]
    return (INTERPRETER_PREP_ROWS if interpreter_on() else rows), words


def _bias_pointer(bias: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """The (N,) bias the kernels add to their float32 sums, contiguous; without one, a tensor
    never read."""
    return stand_in if bias is None else bias.contiguous()


def _split_pointers(
    split: KSplit | None, stand_in: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's (source, lo_start); without one, a tensor never read for both."""
    return (split.source, split.lo_start) if split is not None else (stand_in, stand_in)


@torch.compiler.disable
def exact_matmul(
    a: Operand,
    b: Operand,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: tuple[GemmTile, GemmTile] | None = None,
) -> torch.Tensor:
    """Exact, by the spread of each tile's rows: INT8 tiles (K's outlier windows on FP8 in the
    same program), then the FP8 kernel for the INT8 tiles it left (folded, or per window beyond
    E5M2's range). tiles: (INT8's, FP8's), each of INT8's made of whole FP8 tiles."""
    int8_tile, fp8_tile = tiles or (_tile(None, INT8_TILE), _tile(None, FP8_EXACT_TILE))
    _check_whole_tiles(int8_tile, fp8_tile)
    split = k_split(a.scales, b.scales, a.block)
    prepared = prepare(a, b, int8=True, e5m2=True, tier_flags=True, split=split)
    launch_int8(a, b, prepared, out, int8_tile, bias=bias)
    return launch_fp8(a, b, prepared, out, True, int8_tile, fp8_tile, bias)


def _check_whole_tiles(int8_tile: GemmTile, fp8_tile: GemmTile) -> None:
    """The FP8 kernel writes what the INT8 kernel leaves by whole INT8 tiles: each must be made
    of whole FP8 tiles."""
    if int8_tile.bm % fp8_tile.bm or int8_tile.bn % fp8_tile.bn:
        raise ValueError(f"INT8 tiles {int8_tile.bm} x {int8_tile.bn} are not whole FP8 tiles "
                         f"{fp8_tile.bm} x {fp8_tile.bn}")  # fmt: skip


@torch.compiler.disable
def fp8_matmul(
    a: Operand,
    b: Operand,
    out: torch.Tensor,
    exact: bool,
    fused: bool = False,
    tile: GemmTile | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """On the FP8 kernel only (no INT8 tier), E5M2 staged in memory or decoded in registers
    (`fused`): `exact` (FP8 and per-window tiers, from the tier flags), or fast (promotion every
    BK, blocks beyond 26 binades flushed)."""
    prepared = prepare(a, b, e5m2=not fused, tier_flags=exact)
    return launch_fp8(a, b, prepared, out, exact=exact, tile=tile, bias=bias)


def cublas_fast_supported(
    a: Operand, b: Operand, out: torch.Tensor, bias: torch.Tensor | None = None
) -> bool:
    """Whether `fast_cublas_matmul` can run: a CUDA device with FP8 tensor cores, a contiguous
    bf16 output (and bias, if any), and sizes cuBLAS's FP8 GEMM takes (M, N and K multiples of
    16)."""
    if out.device.type != "cuda" or interpreter_on():
        return False
    if bias is not None and bias.dtype != torch.bfloat16:
        return False
    return (
        torch.cuda.get_device_capability(out.device) >= (8, 9)
        and out.dtype == torch.bfloat16
        and out.is_contiguous()
        and a.rows % 16 == 0
        and b.rows % 16 == 0
        and a.k_padded % 16 == 0
    )


@torch.compiler.disable
def fast_cublas_matmul(
    a: Operand, b: Operand, out: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Fast, through cuBLAS's FP8 GEMM with row-wise scales (`torch._scaled_mm`): each operand
    folded to E4M3 against its rows' largest scale (blocks more than 11 binades below flushed),
    the rows' scales and the (bf16) bias applied in cuBLAS's epilogue. Needs
    `cublas_fast_supported`."""
    prepared = prepare(a, b, e4m3=True)
    assert prepared.e4m3 is not None and prepared.e4m3_scales is not None
    (a8, b8), (scale_a, scale_b) = prepared.e4m3, prepared.e4m3_scales
    return torch._scaled_mm(
        a8, b8.T, scale_a[:, None], scale_b[None, :], bias=bias, out_dtype=torch.bfloat16, out=out
    )


@torch.compiler.disable
def launch_int8(
    a: Operand,
    b: Operand,
    prepared: Prepared,
    out: torch.Tensor,
    tile: GemmTile | None = None,
    hi_bk: int = 64,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The INT8 kernel on INT8-staged operands (and E5M2-staged ones for a split's FP8
    segment); tiles with a row beyond INT8's range are left unwritten."""
    assert prepared.int8 is not None
    split = prepared.split
    assert split is None or prepared.e5m2 is not None
    tile = _tile(tile, INT8_TILE)
    e5m2 = prepared.e5m2 or prepared.int8  # never read without a split
    e5m2_a, e5m2_b = e5m2[0].view(torch.uint8), e5m2[1].view(torch.uint8)
    _, lo_start = _split_pointers(split, prepared.facts)
    launch(
        mxfp4_int8_gemm_kernel, _grid(a.rows, b.rows, tile),
        (*prepared.int8, e5m2_a, e5m2_b, prepared.facts, lo_start,
         out, _bias_pointer(bias, out), a.rows, b.rows, a.k_padded, out.stride(0), out.stride(1)),
        dict(BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m, SPLIT=split is not None,
             HI_BK=hi_bk, HAS_BIAS=bias is not None),
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


@torch.compiler.disable
def launch_fp8(
    a: Operand,
    b: Operand,
    prepared: Prepared,
    out: torch.Tensor,
    exact: bool,
    skip_narrow: GemmTile | None = None,
    tile: GemmTile | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The FP8 kernel, on E5M2-staged operands or (none staged) decoding in registers; with
    `skip_narrow` (the INT8 kernel's tile, made of whole tiles of this one), the tiles inside
    INT8 tiles that the INT8 kernel writes (all rows within its range) are left unwritten."""
    tile = _tile(tile, FP8_EXACT_TILE if exact else FP8_FAST_TILE)
    narrow = skip_narrow or tile
    _check_whole_tiles(narrow, tile)
    staged_a, staged_b = prepared.e5m2 or (a.codes, b.codes)  # never read when fused
    staged_a, staged_b = staged_a.view(torch.uint8), staged_b.view(torch.uint8)
    launch(
        mxfp4_fp8_gemm_kernel, _grid(a.rows, b.rows, tile),
        (a.codes, a.scales, staged_a, b.codes, b.scales, staged_b, prepared.facts,
         out, _bias_pointer(bias, out), a.rows, b.rows, a.k_padded, out.stride(0), out.stride(1)),
        dict(BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m, BLOCK=a.block,
             FUSED=prepared.e5m2 is None, EXACT=exact, SKIP_NARROW=skip_narrow is not None,
             NARROW_BM=narrow.bm, NARROW_BN=narrow.bn, HAS_BIAS=bias is not None),
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


@torch.compiler.disable
def scaled_dot_matmul(
    a: Operand,
    b: Operand,
    out: torch.Tensor,
    tile: GemmTile | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Through Triton's `tl.dot_scaled` (e2m1 x e2m1, block 32): the native MXFP4 MMA on
    Blackwell, a bf16 emulation elsewhere."""
    tile = _tile(tile, SCALED_DOT_TILE)
    launch(
        scaled_dot_kernel, _grid(a.rows, b.rows, tile),
        (a.codes, a.scales, b.codes, b.scales, out, _bias_pointer(bias, out), a.rows, b.rows,
         a.k_padded, out.stride(0), out.stride(1)),
        dict(BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m,
             HAS_BIAS=bias is not None),
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


@torch.compiler.disable
def weight_only_matmul(
    a: torch.Tensor,
    b: Operand,
    out: torch.Tensor,
    tile: GemmTile | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """out = a @ dequantize(b)^T for a float a (M, K): B decoded in registers to a's dtype
    (exact: an E2M1 value times an E8M0 scale is a bfloat16 number) and multiplied on the
    tensor cores in that dtype with float32 accumulation."""
    tile = _tile(tile, WEIGHT_ONLY_TILE)
    a = a.contiguous()
    launch(
        weight_only_kernel, _grid(a.shape[0], b.rows, tile),
        (a, b.codes, b.scales, out, _bias_pointer(bias, out), a.shape[0], b.rows, a.shape[1],
         b.k_padded, out.stride(0), out.stride(1)),
        dict(BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m, BLOCK=b.block,
             HAS_BIAS=bias is not None),
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out
