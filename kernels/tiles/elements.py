"""The 4-bit element grids the quantize kernels round onto: E2M1 (`tile_ops`' helpers) and E1M2,
the uniform grid +-{0, 0.5, .., 3.5} (bias 0: code = 2 |value|), chosen by the constexpr E1M2.

Each function takes |v| already in the block's units and returns the magnitude code (0..7,
saturating at the largest) or the grid value, as the reference's `round_to_grid` rounds:
to nearest with ties to the even code, stochastically with 32 random bits or by the carry of 8
or 16 (SR_BITS), ties away from zero, or toward a guide (Q-EMA). E1M2's spacing is 0.5
everywhere on its grid, so every rule is a rounding of 2|v| to an integer; 2|v| is exact, and
clamped to 8 first (beyond the grid every rule gives code 7, and the clamp keeps the integer
steps exact).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_ops import (
    e2m1_code_away,
    e2m1_code_guided,
    e2m1_code_rne,
    e2m1_code_sr,
    e2m1_rne_grid,
    e2m1_sr_grid,
    signed_e2m1_value,
)

RINT_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: x + M - M rounds x < 2^22


@triton.jit
def _e1m2_twice(magnitude):
    """2|v| in E1M2's steps, clamped to 8 (NaN too, as a block's Inf or NaN is discarded)."""
    return tl.minimum(magnitude * 2.0, 8.0)


@triton.jit
def _e1m2_rne_steps(magnitude):
    """2|v| rounded to the nearest integer, ties to even, at most 7 (float32)."""
    twice = _e1m2_twice(magnitude)
    return tl.minimum((twice + RINT_MAGIC) - RINT_MAGIC, 7.0)


@triton.jit
def _e1m2_sr_steps(magnitude, bits):
    """2|v| rounded up when u = (bits >> 8) / 2^24 < its fraction, else down, at most 7."""
    twice = _e1m2_twice(magnitude)
    floor_twice = tl.floor(twice)
    up = (bits >> 8).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08 < twice - floor_twice
    return tl.minimum(floor_twice + up.to(tl.float32), 7.0)


@triton.jit
def code_rne(magnitude, E1M2: tl.constexpr):
    if E1M2:
        return _e1m2_rne_steps(magnitude).to(tl.int32)
    return e2m1_code_rne(magnitude)


@triton.jit
def rne_grid(magnitude, E1M2: tl.constexpr):
    """The grid value of `code_rne`, without the code."""
    if E1M2:
        return _e1m2_rne_steps(magnitude) * 0.5
    return e2m1_rne_grid(magnitude)


@triton.jit
def code_sr(magnitude, bits, E1M2: tl.constexpr, SR_BITS: tl.constexpr = 24):
    """Stochastic rounding's code: with 32 random bits (SR_BITS 24), or by the carry of an
    SR_BITS-bit field (8 or 16: `_e2m1_carry_grid`)."""
    if SR_BITS != 24:
        if E1M2:
            return _e1m2_carry_steps(magnitude, bits, SR_BITS).to(tl.int32)
        return _e2m1_carry_code(magnitude, bits, SR_BITS)
    if E1M2:
        return _e1m2_sr_steps(magnitude, bits).to(tl.int32)
    return e2m1_code_sr(magnitude, bits)


@triton.jit
def sr_grid(magnitude, bits, E1M2: tl.constexpr, SR_BITS: tl.constexpr = 24):
    """The grid value of `code_sr`, without the code."""
    if SR_BITS != 24:
        if E1M2:
            return _e1m2_carry_steps(magnitude, bits, SR_BITS) * 0.5
        return _e2m1_carry_grid(magnitude, bits, SR_BITS)
    if E1M2:
        return _e1m2_sr_steps(magnitude, bits) * 0.5
    return e2m1_sr_grid(magnitude, bits)


@triton.jit
def _e2m1_carry_total(magnitude, field, BITS: tl.constexpr):
    """|v| plus field / 2^BITS of the step at |v| (the product exact, the sum rounded once).
    The step from |v|'s exponent bits: half of 2^floor(log2 |v|), at least 0.5 (from 8 up it
    exceeds the grid's 2, where every sum saturates either way)."""
    exponent = magnitude.to(tl.int32, bitcast=True) & 0x7F800000
    # the step times 2^-BITS, built as float bits: one product with the field, exact
    scaled_step = (tl.maximum(exponent, 0x3F800000) - ((1 + BITS) << 23)).to(
        tl.float32, bitcast=True
    )
    return magnitude + field.to(tl.int32).to(tl.float32) * scaled_step


@triton.jit
def _e2m1_carry_grid(magnitude, field, BITS: tl.constexpr):
    """|v| rounded stochastically by carry (the reference's "sr_carry"): `_e2m1_carry_total`
    truncated onto the grid in the step at the sum, saturating at 6. From 1 up the truncation
    keeps the sum's exponent and first mantissa bit; below, it is 0.5 or 0."""
    total = _e2m1_carry_total(magnitude, field, BITS)
    kept = (total.to(tl.int32, bitcast=True) & 0x7FC00000).to(tl.float32, bitcast=True)
    return tl.minimum(tl.where(total < 1.0, tl.where(total >= 0.5, 0.5, 0.0), kept), 6.0)


@triton.jit
def _e2m1_carry_code(magnitude, field, BITS: tl.constexpr):
    """The E2M1 magnitude code of `_e2m1_carry_grid`, from the sum's bits: its exponent and
    first mantissa bit from 1 up (`e2m1_value`'s bits read back), at least 1 from 0.5 up, at
    most 7 (6)."""
    total = _e2m1_carry_total(magnitude, field, BITS)
    code = (total.to(tl.int32, bitcast=True) >> 22) - 252
    return tl.minimum(tl.maximum(code, (total >= 0.5).to(tl.int32)), 7)


@triton.jit
def _e1m2_carry_steps(magnitude, field, BITS: tl.constexpr):
    """2|v| plus field / 2^BITS (E1M2's step is 0.5: one unit of 2|v|), truncated, at most 7."""
    fraction = field.to(tl.int32).to(tl.float32) * (1.0 / (1 << BITS))
    return tl.minimum(tl.floor(_e1m2_twice(magnitude) + fraction), 7.0)


@triton.jit
def code_away(magnitude, E1M2: tl.constexpr):
    if E1M2:
        twice = _e1m2_twice(magnitude)
        floor_twice = tl.floor(twice)
        away = (twice - floor_twice >= 0.5).to(tl.float32)
        return tl.minimum(floor_twice + away, 7.0).to(tl.int32)
    return e2m1_code_away(magnitude)


@triton.jit
def code_guided(magnitude, guide, E1M2: tl.constexpr):
    """The bracketing grid point nearer `guide` (in the block's units, on v's side of zero),
    ties in distance to the nearest-even choice, a grid point left where it is."""
    if E1M2:
        lower = tl.minimum(tl.floor(_e1m2_twice(magnitude)), 7.0)
        lower_value = lower * 0.5
        dist_lo = tl.abs(guide - lower_value)
        dist_hi = tl.abs(guide - tl.minimum(lower + 1.0, 7.0) * 0.5)
        nearest_up = _e1m2_rne_steps(magnitude) > lower
        up = tl.where(dist_hi == dist_lo, nearest_up, dist_hi < dist_lo) & (magnitude > lower_value)
        return tl.minimum(lower + up.to(tl.float32), 7.0).to(tl.int32)
    return e2m1_code_guided(magnitude, guide)


@triton.jit
def signed_value(code, E1M2: tl.constexpr):
    """Float32 value of a signed code (sign << 3 | magnitude code; -0.0 for code 8)."""
    if E1M2:
        code = code.to(tl.int32)
        magnitude = ((code & 7).to(tl.float32) * 0.5).to(tl.int32, bitcast=True)
        return (magnitude | ((code & 8) << 28)).to(tl.float32, bitcast=True)
    return signed_e2m1_value(code)
