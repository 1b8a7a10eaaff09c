"""Four-over-six in the quantize kernels: which of a tile's blocks keep the candidate scaled to 4.

`fp4cli.quant.four_over_six` defines the choice: each candidate's error is an exact int64 sum of
truncated float64 squares, so the kernels reproduce it in any order, and a 2-D tile (its 16
rows' sums added) decides alike read along its rows or down its columns. The two sums are
compared through one reduction of their terms' differences (the GPT-2-small step of
nvfp4-4over6: 29.6 ms against 30.3 with two sums, docs/benchmarks.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.dequantize import scaled_grid
from fp4cli.kernels.elements import signed_value
from fp4cli.kernels.tile_ops import FLOAT32_MAX, square_reduce

TERM_MAX = tl.constexpr(2.0**54)


@triton.jit
def error_units(amax_bits):
    """2^(24 - E) = 2^(150 - max(f, 1)) as float64, f each block's amax exponent field."""
    field = tl.maximum(amax_bits >> 23, 1).to(tl.int64)
    return ((1173 - field) << 52).to(tl.float64, bitcast=True)  # 1173: 150 + float64's bias


@triton.jit
def error_terms(x64, grid, scale, finite_blocks, unit, tensor_amax, BLOCK_AXIS: tl.constexpr,
                TENSOR_SCALE: tl.constexpr, DECODE_INV: tl.constexpr):  # fmt: skip
    """The int64 error terms of the signed grid values `grid` with scales `scale`, decoded as
    `scaled_grid` decodes them, against the blocks x64 (x in float64), and per block whether a
    value decodes to Inf or NaN (int32 0 or 1)."""
    decoded = scaled_grid(grid, scale, finite_blocks, tensor_amax, 1.0, TENSOR_SCALE, DECODE_INV,
                          BLOCK_AXIS, 0.0, 0.0, 0.0, False)  # fmt: skip
    finite = tl.abs(decoded) <= FLOAT32_MAX
    scaled = (decoded.to(tl.float64) - x64) * tl.expand_dims(unit, BLOCK_AXIS + 1)
    terms = tl.where(finite, tl.minimum(scaled * scaled, TERM_MAX), 0.0).to(tl.int64)
    return terms, tl.max((~finite).to(tl.int32), axis=BLOCK_AXIS + 1)


@triton.jit
def prefer_four(
    x, code_six, code_four, scale_six, scale_four, finite_blocks, amax_bits, tensor_amax,
    ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_AXIS: tl.constexpr,
    TENSOR_SCALE: tl.constexpr, DECODE_INV: tl.constexpr, TILE2D: tl.constexpr,
    GRID: tl.constexpr, E1M2: tl.constexpr,
):  # fmt: skip
    """Per block (square under TILE2D): whether the candidate scaled to 4 is strictly nearer
    the float32 blocks x (`quantize.block_view`). The candidates are signed codes (GRID: signed
    grid values) and scale values; amax_bits the blocks' amax bits, which set the error unit.
    The two integer sums are compared as the sum of their terms' differences (one reduction,
    the same result); an infinite error loses to a finite one, and two tie (six kept)."""
    grid_six = code_six
    grid_four = code_four
    if not GRID:
        grid_six = signed_value(code_six, E1M2)
        grid_four = signed_value(code_four, E1M2)
    unit = error_units(amax_bits)
    x64 = x.to(tl.float64)
    six, infinite_six = error_terms(
        x64, grid_six, scale_six, finite_blocks, unit, tensor_amax, BLOCK_AXIS, TENSOR_SCALE,
        DECODE_INV,
    )  # fmt: skip
    four, infinite_four = error_terms(
        x64, grid_four, scale_four, finite_blocks, unit, tensor_amax, BLOCK_AXIS, TENSOR_SCALE,
        DECODE_INV,
    )  # fmt: skip
    four_minus_six = tl.sum(four - six, axis=BLOCK_AXIS + 1)
    if TILE2D:
        four_minus_six = square_reduce(four_minus_six, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
        infinite_six = square_reduce(infinite_six, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
        infinite_four = square_reduce(infinite_four, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
    return (infinite_four == 0) & ((infinite_six > 0) | (four_minus_six < 0))
