"""Python side of the vector-wise kernels (`vector_wise.py`): which kernel quantizes a 2-D tensor
along an axis with a row / column / tensor spec, their tiles, constants and launches.

`quantize_vector` gives exactly the reference's `fake_quantize` values (signs of zero included)
or codes and float32 scales that `decode_vector` turns into them. Nothing here reads a value
back to the host, so the calls can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.host.tiling import (
    ColumnSums,
    add_column_sums,
    partial_column_sums,
    pow2_at_least,
)
from fp4cli.kernels.vector.dge import dge_apply_kernel, dge_position_kernel
from fp4cli.kernels.vector.order_stats import candidate_groups
from fp4cli.kernels.vector.vector_wise import amax_kernel, decode_kernel, rows_kernel, scaled_kernel
from fp4cli.quant.spec import QuantSpec
from fp4cli.techniques.dge import DGEConfig

VECTOR_ELEMENTS = ("e2m1", "e4m3", "e5m2")
VECTOR_BLOCKS = ("row", "column", "tensor")
BY_CODE = {"row": 0, "column": 1, "tensor": 2}
ROW_CHUNK = 4096  # the longest row held in registers; longer rows are read in chunks
CLAMP_ROW_CHUNK = 16384  # the same for the clamp's programs on a GPU (a row each, 8 warps)
CLAMP_WARP_VALUES = 1024  # the values of a row a warp of the clamp's programs holds (timed)
TILE = (32, 128)  # the elementwise kernels' tile: rows, columns
TILE_T = (64, 128)  # scaled_kernel's tile when it writes the transpose's codes
# The amax pass's programs: G tiles of TILE down a strip of columns, the warps; with column
# sums 8 tiles at 2 warps, which sum element by element and reduce once (on one H200 at
# 8192 x 768 / 2304 / 3072 bf16: 10.5 / 14.3 / 17.1 us against 15.7 / 34.4 / 44.9 for a tile a
# program at 4 warps, whose per-tile column sums cost more than the read), else 4 at 4 warps.
AMAX_GROUP_SUMS, AMAX_GROUP = (8, 2), (4, 4)
# Low bits of float32 that every value of a narrower dtype leaves zero: the clamp's threshold
# search skips them (`row_thresholds`).
KEY_ZERO_BITS = {torch.bfloat16: 16, torch.float16: 13}


def vector_spec_gap(spec: QuantSpec) -> str | None:
    """Why the vector-wise kernels cannot quantize with `spec`, or None when they can."""
    if spec.element not in VECTOR_ELEMENTS:
        return f"element {spec.element!r} (vector-wise kernels: {', '.join(VECTOR_ELEMENTS)})"
    if spec.block not in VECTOR_BLOCKS:
        return f"block {spec.block!r} (vector-wise kernels: row, column, tensor)"
    if spec.scale != "e8m0":
        return f"scale {spec.scale!r} (vector-wise kernels: e8m0)"
    if spec.rounding not in ("rne", "ties_up"):
        return f"rounding {spec.rounding!r} (vector-wise kernels: rne, ties_up)"
    if spec.four_over_six:
        return "four-over-six (the reference runs it)"
    return None


def scaled_by(spec: QuantSpec, axis: int) -> str:
    """What one scale of `spec` along `axis` of a 2-D tensor covers: "row", "column" or
    "tensor". Block "row" is the whole axis (axis 1: a row; axis 0: a column); block "column"
    one position along it, across the other axis (axis 1: a column; axis 0: a row)."""
    if spec.block == "tensor":
        return "tensor"
    along_rows = (spec.block == "row") == (axis == 1)
    return "row" if along_rows else "column"


def scale_count(spec: QuantSpec, axis: int, shape: tuple[int, ...]) -> int:
    """How many scales (and amax slots) the tensor has."""
    by = scaled_by(spec, axis)
    return {"row": shape[0], "column": shape[1], "tensor": 1}[by]


def element_constants(spec: QuantSpec) -> dict[str, object]:
    """The element format's constexprs: its grid (MBITS, MIN_EXP, ELEM_MAX), its largest value
    as 2^ELEM_MAX_EXP * (1 + ELEM_MAX_MANT / 2^23), the scale rule (SCALE_BF16: MS-AMP's
    bfloat16 arithmetic), the code's sign bit and the tie rule (TIES_UP: toward +inf, else to
    even)."""
    fmt = spec.element_format
    mantissa, exponent = math.frexp(fmt.max_value)  # max = mantissa * 2^exponent, in [0.5, 1)
    return dict(
        MBITS=fmt.mbits,
        MIN_EXP=fmt.min_exponent,
        ELEM_MAX=fmt.max_value,
        ELEM_MAX_EXP=exponent - 1,
        ELEM_MAX_MANT=int((mantissa * 2 - 1) * (1 << 23)),
        CEIL=spec.scale_rule == "ceil",
        SCALE_BF16=spec.scale_bf16,
        SIGN_BIT=fmt.sign_bit,
        TIES_UP=spec.rounding == "ties_up",
    )


def _row_split(cols: int, chunk: int) -> tuple[int, int]:
    """(BC, TAIL) of the rows kernel: a row of up to `chunk` values is held in registers as
    the largest power of two of columns it holds, then a power-of-two tail for the rest (768 =
    512 + 256: no masked lanes to count in each pass of the clamp search; TAIL 0 when none);
    a longer row is read in chunks of `chunk`."""
    if cols > chunk:
        return chunk, 0
    head = 1 << (cols.bit_length() - 1)
    return head, pow2_at_least(cols - head) if cols > head else 0


def bound_split(keys_beyond: int, groups: int) -> int:
    """How many sets the rows kernel splits the `groups` candidate groups of a row's head into
    to bound a threshold search (`order_stats._bounds`): the least power of two at least the
    number of the row's values at or beyond the threshold's rank (at or above it for the upper
    rank, at or below for the lower), or 0 (no bound) when there are fewer groups."""
    split = pow2_at_least(keys_beyond)
    return split if split <= groups else 0


@dataclass(frozen=True)
class Clamp:
    """Per-row clamping to the values of 0-based ascending ranks low and high, with the
    clamped-off part added back to the written values when `residual`."""

    low: int
    high: int
    residual: bool = False


def search_splits(clamp: Clamp | None, cols: int, groups: int, one_chunk: bool) -> tuple[int, int]:
    """(SPLIT_LOW, SPLIT_HIGH) of the rows kernel: the sets that bound the search for each of
    the clamp's ranks in rows of `cols` values whose head in registers gives `groups` groups
    of candidates (`bound_split` of the keys at or below the lower rank, at or above the
    upper); (0, 0) without a clamp or for rows read in chunks, which the search does not
    bound."""
    if clamp is None or not one_chunk:
        return 0, 0
    return bound_split(clamp.low + 1, groups), bound_split(cols - clamp.high, groups)


@torch.compiler.disable
def quantize_vector(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    dtype: torch.dtype | None,
    *,
    clamp: Clamp | None = None,
    scales: bool = False,
    amax_out: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    column_sums: torch.Tensor | ColumnSums | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values in `dtype`, or uint8 codes when dtype is None; float32 scales when `scales`) of a
    contiguous 2-D `x` fake-quantized along `axis` with a row / column / tensor `spec`.

    clamp: per-row clamping (only for scales by row). amax_out: a 1-element int32 tensor into
    which the written values' largest |value| bits are maxed (for a per-tensor spec of them).
    For column and tensor scales: `amax`, the int32 amax bits already reduced (`amax_out` of
    the pass that wrote x), or `workspace`, zeroed int32 slots (`scale_count`) to reduce them
    into (else allocated here); `column_sums` (cols,) float32, filled with x's column sums by
    that reduction (`line_amax`)."""
    by = scaled_by(spec, axis)
    if clamp is not None and by != "row":
        raise ValueError("clamping needs one scale per row")
    _check_sums(column_sums, by, amax)
    out = torch.empty(x.shape, dtype=dtype or torch.uint8, device=x.device)
    scale_out = _scale_tensor(spec, axis, x) if scales else None
    flags = _flags(spec, dtype is None, scales, amax_out is not None)
    if by == "row":
        _launch_rows(x, out, scale_out, amax_out, clamp, flags)
    else:
        _launch_scaled(
            x, (amax, workspace, column_sums), (out, None), scale_out, amax_out, by, flags
        )
    return out, scale_out


@torch.compiler.disable
def quantize_codes(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    *,
    rows_out: bool,
    transposed: bool,
    amax: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    column_sums: torch.Tensor | ColumnSums | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """(uint8 codes in x's layout when `rows_out`; codes of x's transpose, a contiguous
    (cols, rows), when `transposed`; float32 scales) of a contiguous 2-D `x` quantized along
    `axis` with a column / tensor `spec`: the layouts a GEMM that reads K contiguous in both
    operands (`fp4cli.gemm.fp8.fp8_mm`) takes. amax, workspace, column_sums: as for
    `quantize_vector`."""
    by = scaled_by(spec, axis)
    if by == "row" or not (rows_out or transposed):
        raise ValueError("codes in some layout, of column or tensor scales, are written here")
    _check_sums(column_sums, by, amax)
    rows, cols = x.shape
    out = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if rows_out else None
    out_t = torch.empty((cols, rows), dtype=torch.uint8, device=x.device) if transposed else None
    scale_out = _scale_tensor(spec, axis, x)
    flags = _flags(spec, True, True, False)
    _launch_scaled(x, (amax, workspace, column_sums), (out, out_t), scale_out, None, by, flags)
    return out, out_t, scale_out


def _check_sums(
    column_sums: torch.Tensor | ColumnSums | None, by: str, amax: torch.Tensor | None
) -> None:
    """Column sums come from the amax reduction: scales by column or tensor, reduced here."""
    if column_sums is not None and (by == "row" or amax is not None):
        raise ValueError("column sums come from the amax pass (column or tensor scales, no amax)")


def _scale_tensor(spec: QuantSpec, axis: int, x: torch.Tensor) -> torch.Tensor:
    """The float32 scales' tensor of x quantized along `axis`."""
    return torch.empty(scale_count(spec, axis, x.shape), dtype=torch.float32, device=x.device)


def _flags(spec: QuantSpec, codes: bool, scales: bool, amax_out: bool) -> dict[str, object]:
    """The constexprs both per-row and scaled kernels take: what they write, and the format's."""
    return dict(
        WRITE_CODES=codes, WRITE_SCALES=scales, AMAX_OUT=amax_out, **element_constants(spec)
    )


def _launch_scaled(
    x: torch.Tensor,
    lines: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
    outs: tuple[torch.Tensor | None, torch.Tensor | None],
    scale_out: torch.Tensor | None,
    amax_out: torch.Tensor | None,
    by: str,
    flags: dict[str, object],
) -> None:
    """`scaled_kernel` over x, writing outs = (x's layout, codes of the transpose) where given;
    tiles TILE_T when the transpose is written (longer runs of its rows). lines = (amax,
    workspace, column_sums): without the amax, the lines' amax is reduced first (into the
    workspace when given, with the column sums when asked)."""
    amax, workspace, column_sums = lines
    if amax is None:
        amax = line_amax(x, by, workspace, column_sums)
    rows, cols = x.shape
    out, out_t = outs
    br, bc = TILE if out_t is None else TILE_T
    tiles_c = -(-cols // bc)
    first = out if out is not None else out_t
    launch(
        scaled_kernel, (-(-rows // br) * tiles_c,),
        (x, amax, first, out_t if out_t is not None else first, scale_out, amax_out,
         rows, cols, tiles_c),
        dict(BR=br, BC=bc, BY=BY_CODE[by], ROWS_OUT=out is not None, CODES_T=out_t is not None,
             **flags),
        num_warps=4,
    )  # fmt: skip


def _launch_rows(
    x: torch.Tensor,
    out: torch.Tensor,
    scale_out: torch.Tensor | None,
    amax_out: torch.Tensor | None,
    clamp: Clamp | None,
    flags: dict[str, object],
) -> None:
    rows, cols = x.shape
    if clamp is not None and x.is_cuda:  # compute-bound: a row a program
        bc, tail = _row_split(cols, CLAMP_ROW_CHUNK)
        br, warps = 1, max(1, min(8, pow2_at_least(cols) // CLAMP_WARP_VALUES))
    else:
        bc, tail = _row_split(cols, ROW_CHUNK)
        br = max(1, min(pow2_at_least(rows), ROW_CHUNK // pow2_at_least(bc + tail)))
        warps = 8 if br * (bc + tail) >= 4096 else 4
    one_chunk = cols <= bc + tail
    group, tail_group = candidate_groups(bc, tail)
    split_low, split_high = search_splits(clamp, cols, bc // group, one_chunk)
    launch(
        rows_kernel, (-(-rows // br),),
        (x, out, scale_out, amax_out, rows, cols,
         clamp.low if clamp else 0, clamp.high if clamp else 0),
        dict(BR=br, BC=bc, ONE_CHUNK=one_chunk, TAIL=tail, CLAMP=clamp is not None,
             GROUP=group, TAIL_GROUP=tail_group, SPLIT_LOW=split_low, SPLIT_HIGH=split_high,
             ZERO_BITS=KEY_ZERO_BITS.get(x.dtype, 0),
             RESIDUAL=clamp is not None and clamp.residual, **flags),
        num_warps=warps,
    )  # fmt: skip


@torch.compiler.disable
def line_amax(
    x: torch.Tensor,
    by: str,
    out: torch.Tensor | None = None,
    column_sums: torch.Tensor | ColumnSums | None = None,
) -> torch.Tensor:
    """The largest |x| bits (int32) of each column (by "column") or of the tensor (by
    "tensor") of a contiguous 2-D x, maxed into `out` (zeroed here when not given).
    column_sums (cols,) float32: filled with the sums of x's columns from the same read,
    summed in float32 over each program's tiles element by element, then over their rows,
    then over the programs (a `ColumnSums` keeps the programs' sums unadded)."""
    rows, cols = x.shape
    if out is None:
        out = torch.zeros(cols if by == "column" else 1, dtype=torch.int32, device=x.device)
    br, bc = TILE
    group, warps = AMAX_GROUP_SUMS if column_sums is not None else AMAX_GROUP
    groups, tiles_c = -(-rows // (br * group)), -(-cols // bc)
    partial_sums = partial_column_sums(column_sums, cols, groups, x.device)
    launch(
        amax_kernel, (groups * tiles_c,), (x, out, partial_sums, rows, cols, tiles_c),
        dict(BR=br, BC=bc, G=group, BY=BY_CODE[by], COLUMN_SUMS=partial_sums is not None),
        num_warps=warps,
    )  # fmt: skip
    add_column_sums(partial_sums, column_sums)
    return out


@torch.compiler.disable
def decode_vector(
    codes: torch.Tensor, scales: torch.Tensor, spec: QuantSpec, axis: int, dtype: torch.dtype
) -> torch.Tensor:
    """The values (in `dtype`) of the codes and scales `quantize_vector` wrote."""
    rows, cols = codes.shape
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    fmt = spec.element_format
    br, bc = TILE
    tiles_c = -(-cols // bc)
    launch(
        decode_kernel, (-(-rows // br) * tiles_c,), (codes, scales, out, rows, cols, tiles_c),
        dict(BR=br, BC=bc, BY=BY_CODE[scaled_by(spec, axis)], MBITS=fmt.mbits,
             MIN_EXP=fmt.min_exponent, MAX_CODE=fmt.max_code, SIGN_BIT=fmt.sign_bit),
        num_warps=4,
    )  # fmt: skip
    return out


@torch.compiler.disable
def dge_scale_gradient(
    grad_w: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    spec: QuantSpec,
    config: DGEConfig,
) -> torch.Tensor:
    """grad_w (any strides) multiplied in place by DGE's derivative
    (`fp4cli.techniques.dge.dge_derivative`) on the contiguous weight over `scales`, the float32
    scales of `spec` along axis 1 that the forward W pass wrote; returns grad_w."""
    rows, cols = weight.shape
    fmt = spec.element_format
    br, bc = TILE
    tiles_c = -(-cols // bc)
    grid = (-(-rows // br) * tiles_c,)
    power = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    launch(
        dge_position_kernel, grid, (weight, scales, power, rows, cols, tiles_c),
        dict(BR=br, BC=bc, BY=BY_CODE[scaled_by(spec, 1)], MBITS=fmt.mbits,
             MIN_EXP=fmt.min_exponent, ELEM_MAX=fmt.max_value),
        num_warps=4,
    )  # fmt: skip
    power.pow_(config.exponent)  # torch's pow: the reference's bits
    launch(
        dge_apply_kernel, grid,
        (grad_w, power, rows, cols, tiles_c, grad_w.stride(0), grad_w.stride(1),
         config.inverse_k, float(config.cap)),
        dict(BR=br, BC=bc), num_warps=4,
    )  # fmt: skip
    return grad_w
