"""MS-EDEN's scale correction in the quantize kernels (`fp4cli.quant.ms_eden` defines it).

Within a tile that holds whole correction groups along its blocks, a block's elements are
already rounded to nearest (ties away) with its two-level scale; here each group's
c = sum(u * u) / sum(u * q) is formed from the same fixed-point terms as the reference (each
exact float64 product truncated to a multiple of 2^-16, so the tile's summation order gives
the reference's sums; a block's terms summed in int32), taken as a float64 ratio, rounded to
float32, and each usable block's scale s becomes s * c rounded stochastically onto the scale
grid with the uniform number of the block's first element.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_ops import outer_reduce, pow2, round_unsigned_minifloat

SUM_UNIT = tl.constexpr(2.0**16)  # `fp4cli.quant.ms_eden.SUM_UNIT`
# Blocks of up to 16 values sum their terms in int32 (half the exchanges of int64 sums): |u| < 32
# in grid units (6 * sr_prescale, sr_prescale at most 2, times at most 1.5 where a block scale
# rounds to E4M3's least subnormal), so a term is below 2^10 / 2^-16 = 2^26, 16 of them 2^30.
BLOCK_SUMS_32 = tl.constexpr(16)


@triton.jit
def sr_unsigned_minifloat(value, bits, MBITS: tl.constexpr, MIN_EXP: tl.constexpr,
                          MAX_VALUE: tl.constexpr):  # fmt: skip
    """(value, code) of value >= 0 rounded stochastically onto an unsigned minifloat grid
    (`fp4cli.formats.round_to_grid`'s "sr"): up when the uniform number (bits >> 8) / 2^24 is
    below the fraction of a grid step past the lower point, saturating at MAX_VALUE."""
    field = (value.to(tl.int32, bitcast=True) >> 23) & 0xFF
    exponent = tl.maximum(field - 127, MIN_EXP)  # floor(log2 value), clamped to the normals
    units = value * pow2(MBITS - exponent)  # exact: a power of two
    floor_units = tl.floor(units)
    uniform = (bits >> 8).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08
    up = (uniform < units - floor_units).to(tl.float32)
    rounded = tl.minimum((floor_units + up) * pow2(exponent - MBITS), MAX_VALUE)
    return round_unsigned_minifloat(rounded, MBITS, MIN_EXP, MAX_VALUE, False, True)


@triton.jit
def eden_scales(
    units, grid_magnitude, finite_values, scale, scale_code, block_bits, ROWS: tl.constexpr,
    COLS: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, BLOCK_AXIS: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr, SCALE_MAX: tl.constexpr,
):  # fmt: skip
    """(scale values, scale codes) after the correction, for blocks (`quantize_tile.block_view`)
    whose magnitudes in grid units (`units`, pre-scale included) rounded to `grid_magnitude`
    (|q|); `finite_values` marks the elements that take part (the reference zeroes the
    others); groups of GROUP blocks along the blocks' axis; `block_bits` (uint32, one per
    block) the Philox bits of each block's first element. A block of scale 0 keeps it."""
    usable = scale > 0
    take = finite_values & tl.expand_dims(usable, BLOCK_AXIS + 1)
    u = tl.where(take, units, 0.0).to(tl.float64)
    q = tl.where(take, grid_magnitude, 0.0).to(tl.float64)
    if BLOCK <= BLOCK_SUMS_32:  # a block's sums fit 31 bits (`BLOCK_SUMS_32`)
        num = tl.sum((u * u * SUM_UNIT).to(tl.int32), axis=BLOCK_AXIS + 1).to(tl.int64)
        den = tl.sum((u * q * SUM_UNIT).to(tl.int32), axis=BLOCK_AXIS + 1).to(tl.int64)
    else:
        num = tl.sum((u * u * SUM_UNIT).to(tl.int64), axis=BLOCK_AXIS + 1)
        den = tl.sum((u * q * SUM_UNIT).to(tl.int64), axis=BLOCK_AXIS + 1)
    num = outer_reduce(num, ROWS, COLS, BLOCK, GROUP, BLOCK_AXIS, True).to(tl.float64)
    den = outer_reduce(den, ROWS, COLS, BLOCK, GROUP, BLOCK_AXIS, True).to(tl.float64)
    ratio = (num / tl.where(den == 0, 1.0, den)).to(tl.float32)
    correction = tl.where(den == 0, 1.0, ratio)
    corrected, corrected_code = sr_unsigned_minifloat(
        scale * correction, block_bits, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX
    )
    return tl.where(usable, corrected, scale), tl.where(usable, corrected_code, scale_code)
