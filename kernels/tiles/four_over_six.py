"""Four-over-six in the quantize kernels: which of a tile's blocks keep the candidate scaled to 4.

`fp4cli.quant.four_over_six` defines the choice: each candidate's error is an exact int64 sum of
truncated float64 squares, so the kernels reproduce it in any order, and a 2-D tile (its 16
rows' sums added) decides alike read along its rows or down its columns. The two sums are
compared through one reduction of their terms' differences (the GPT-2-small step of
nvfp4-4over6: 29.6 ms against 30.3 with two sums, docs/benchmarks.md).

Those float64 and int64 terms cost a kernel about 55 instructions a value. So the kernels
first sum each candidate's squared errors in float32 (`estimated_preference`); a bound on the
float32 sums' error shows, for nearly every block, that their order is the integer sums'
order, and a tile with any block it does not tell takes the exact sums. A pair kernel taking
four-over-six both ways estimates along the rows only: with the fallback in both directions
it spills (197 spill stores compiled for sm_90 against 40).

The absolute-error metric (`QuantSpec.four_over_six_metric` "mae", FOUR_OVER_SIX_MAE) takes the
exact sums alone: its terms, `|d - x|` in the finer unit, are the same float64 and int64 steps.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.block_values import scaled_grid
from fp4cli.kernels.tiles.elements import signed_value
from fp4cli.kernels.tiles.tile_ops import FLOAT32_MAX, square_reduce

# The kernels' FOUR_OVER_SIX: off, the exact sums alone, the float32 estimate first, or the
# exact sums of absolute errors
FOUR_OVER_SIX_OFF = tl.constexpr(0)
FOUR_OVER_SIX_EXACT = tl.constexpr(1)
FOUR_OVER_SIX_ESTIMATE = tl.constexpr(2)
FOUR_OVER_SIX_MAE = tl.constexpr(3)
TERM_MAX = tl.constexpr(2.0**54)
ABSOLUTE_UNIT = tl.constexpr(2.0**24)  # the absolute error's unit is 2^24 times finer
# The float32 estimate (`estimated_preference`): its relative error bound, with room to spare,
# for sums of up to 256 terms, and the float32 range its units and errors keep to.
ESTIMATE_SLACK = tl.constexpr(2.0**-14)
LEAST_FIELD = tl.constexpr(23)  # 2^(150 - f) is a float32 for f >= 23
ERROR_MAX = tl.constexpr(2.0**26)


@triton.jit
def error_units(amax_bits):
    """2^(24 - E) = 2^(150 - max(f, 1)) as float64, f each block's amax exponent field."""
    field = tl.maximum(amax_bits >> 23, 1).to(tl.int64)
    return ((1173 - field) << 52).to(tl.float64, bitcast=True)  # 1173: 150 + float64's bias


@triton.jit
def error_terms(x64, decoded, unit, BLOCK_AXIS: tl.constexpr, ABSOLUTE: tl.constexpr):
    """The int64 error terms of the decoded values against the blocks x64 (x in float64):
    squared, or (ABSOLUTE) absolute errors."""
    finite = tl.abs(decoded) <= FLOAT32_MAX
    scaled = (decoded.to(tl.float64) - x64) * tl.expand_dims(unit, BLOCK_AXIS + 1)
    if ABSOLUTE:  # noqa: SIM108 (a constexpr branch, resolved when compiling)
        error = tl.abs(scaled) * ABSOLUTE_UNIT
    else:
        error = scaled * scaled
    return tl.where(finite, tl.minimum(error, TERM_MAX), 0.0).to(tl.int64)


@triton.jit
def exact_sign(x, decoded_six, decoded_four, amax_bits, ROWS: tl.constexpr, COLS: tl.constexpr,
               BLOCK: tl.constexpr, BLOCK_AXIS: tl.constexpr, TILE2D: tl.constexpr,
               ABSOLUTE: tl.constexpr = False):  # fmt: skip
    """Per block (square), the sign (-1, 0 or 1) of four's integer error minus six's
    (`fp4cli.quant.four_over_six`; ABSOLUTE: of the absolute errors), summed as one reduction
    of the terms' differences."""
    unit = error_units(amax_bits)
    x64 = x.to(tl.float64)
    six = error_terms(x64, decoded_six, unit, BLOCK_AXIS, ABSOLUTE)
    four = error_terms(x64, decoded_four, unit, BLOCK_AXIS, ABSOLUTE)
    four_minus_six = tl.sum(four - six, axis=BLOCK_AXIS + 1)
    if TILE2D:
        four_minus_six = square_reduce(four_minus_six, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
    return tl.where(four_minus_six < 0, -1, tl.where(four_minus_six > 0, 1, 0))


@triton.jit
def estimated_errors(x, decoded, unit, BLOCK_AXIS: tl.constexpr):
    """Per block, the float32 sum of the squared errors in the units of `error_units`, and its
    largest scaled error (finite decoded values only, as the exact terms)."""
    finite = tl.abs(decoded) <= FLOAT32_MAX
    scaled = tl.where(finite, (decoded - x) * tl.expand_dims(unit, BLOCK_AXIS + 1), 0.0)
    largest = tl.max(tl.abs(scaled), axis=BLOCK_AXIS + 1)
    return tl.sum(scaled * scaled, axis=BLOCK_AXIS + 1), largest


@triton.jit
def estimated_preference(x, decoded_six, decoded_four, amax_bits, ROWS: tl.constexpr,
                         COLS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_AXIS: tl.constexpr,
                         TILE2D: tl.constexpr):  # fmt: skip
    """Per block (square): the sign of four's integer error minus six's (-1, 0 or 1) from float32
    sums, and whether those sums cannot tell it. Each float32 sum S lies within 2^-15 * S + 1 of
    the real sum of the exact terms before truncation, which lies within 257 of the integer
    error, so a difference beyond ESTIMATE_SLACK * (S4 + S6) + 2 * 257 has the integer
    difference's sign; two sums under 1/2 leave every term under 1, both errors 0. Blocks whose
    amax is under 2^-104 (their unit is no float32) or whose scaled error passes 2^26 are not
    told."""
    field = tl.maximum(amax_bits >> 23, 1)
    unit = ((277 - field) << 23).to(tl.float32, bitcast=True)  # 2^(150 - field): 277 = 150 + 127
    six, six_largest = estimated_errors(x, decoded_six, unit, BLOCK_AXIS)
    four, four_largest = estimated_errors(x, decoded_four, unit, BLOCK_AXIS)
    out_of_range = (field < LEAST_FIELD) | (tl.maximum(six_largest, four_largest) >= ERROR_MAX)
    if TILE2D:
        six = square_reduce(six, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
        four = square_reduce(four, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
        out_of_range = square_reduce(out_of_range.to(tl.int32), ROWS, COLS, BLOCK, BLOCK_AXIS,
                                     False) > 0  # fmt: skip
    apart = tl.abs(four - six) > (four + six) * ESTIMATE_SLACK + 514.0
    both_small = (four < 0.5) & (six < 0.5)
    sign = tl.where(apart, tl.where(four < six, -1, 1), 0)
    return sign, out_of_range | ~(apart | both_small)


@triton.jit
def decoded_candidate(grid, scale, finite_blocks, tensor_amax, BLOCK_AXIS: tl.constexpr,
                      TENSOR_SCALE: tl.constexpr, DECODE_INV: tl.constexpr,
                      PRESCALE: tl.constexpr, PRESCALE_INV: tl.constexpr,
                      PRESCALE_FIX: tl.constexpr, PRESCALE_FIX_RATIO: tl.constexpr,
                      PRESCALE_REMAINDER: tl.constexpr):  # fmt: skip
    """A candidate's values decoded as `scaled_grid` decodes them (over the SR pre-scale, as
    `tiles.prescale` divides), and per block whether one is Inf or NaN (int32 0 or 1)."""
    decoded = scaled_grid(grid, scale, finite_blocks, tensor_amax, PRESCALE, TENSOR_SCALE,
                          DECODE_INV, BLOCK_AXIS, PRESCALE_INV, PRESCALE_FIX, PRESCALE_FIX_RATIO,
                          PRESCALE_REMAINDER)  # fmt: skip
    infinite = tl.max((~(tl.abs(decoded) <= FLOAT32_MAX)).to(tl.int32), axis=BLOCK_AXIS + 1)
    return decoded, infinite


@triton.jit
def prefer_four(
    x, code_six, code_four, scale_six, scale_four, finite_blocks, amax_bits, tensor_amax,
    ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_AXIS: tl.constexpr,
    TENSOR_SCALE: tl.constexpr, DECODE_INV: tl.constexpr, TILE2D: tl.constexpr,
    GRID: tl.constexpr, E1M2: tl.constexpr, MODE: tl.constexpr, PRESCALE: tl.constexpr,
    PRESCALE_INV: tl.constexpr, PRESCALE_FIX: tl.constexpr, PRESCALE_FIX_RATIO: tl.constexpr,
    PRESCALE_REMAINDER: tl.constexpr,
):  # fmt: skip
    """Per block (square under TILE2D): whether the candidate scaled to 4 is strictly nearer
    the float32 blocks x (`quantize_tile.block_view`). The candidates are signed codes (GRID: signed
    grid values) and scale values; amax_bits the blocks' amax bits, which set the error unit;
    the PRESCALE constants decode them over the SR pre-scale (`scaled_grid`).
    An infinite error loses to a finite one, and two tie (six kept). The integer errors are
    compared (MODE FOUR_OVER_SIX_ESTIMATE) through float32 sums where those tell their order
    (`estimated_preference`), and on a tile with any block they do not tell, or in MODE
    FOUR_OVER_SIX_EXACT, exactly (`exact_sign`); FOUR_OVER_SIX_MAE compares the absolute
    errors' exact sums."""
    grid_six = code_six
    grid_four = code_four
    if not GRID:
        grid_six = signed_value(code_six, E1M2)
        grid_four = signed_value(code_four, E1M2)
    decoded_six, infinite_six = decoded_candidate(
        grid_six, scale_six, finite_blocks, tensor_amax, BLOCK_AXIS, TENSOR_SCALE, DECODE_INV,
        PRESCALE, PRESCALE_INV, PRESCALE_FIX, PRESCALE_FIX_RATIO, PRESCALE_REMAINDER,
    )  # fmt: skip
    decoded_four, infinite_four = decoded_candidate(
        grid_four, scale_four, finite_blocks, tensor_amax, BLOCK_AXIS, TENSOR_SCALE, DECODE_INV,
        PRESCALE, PRESCALE_INV, PRESCALE_FIX, PRESCALE_FIX_RATIO, PRESCALE_REMAINDER,
    )  # fmt: skip
    if TILE2D:
        infinite_six = square_reduce(infinite_six, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
        infinite_four = square_reduce(infinite_four, ROWS, COLS, BLOCK, BLOCK_AXIS, True)
    if MODE == FOUR_OVER_SIX_ESTIMATE:
        both_finite = (infinite_six == 0) & (infinite_four == 0)
        sign, untold = estimated_preference(x, decoded_six, decoded_four, amax_bits, ROWS, COLS,
                                            BLOCK, BLOCK_AXIS, TILE2D)  # fmt: skip
        if tl.max((untold & both_finite).to(tl.int32)) > 0:
            sign = exact_sign(x, decoded_six, decoded_four, amax_bits, ROWS, COLS, BLOCK,
                              BLOCK_AXIS, TILE2D)  # fmt: skip
    else:
        sign = exact_sign(x, decoded_six, decoded_four, amax_bits, ROWS, COLS, BLOCK, BLOCK_AXIS,
                          TILE2D, MODE == FOUR_OVER_SIX_MAE)  # fmt: skip
    return (infinite_four == 0) & ((infinite_six > 0) | (sign < 0))
