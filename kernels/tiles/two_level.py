"""Two-level block scales in the kernels: `fp4cli.quant.two_level`'s formulas, per tensor once.

A block's encode multiplier e = min(1 / (s * D), FLT_MAX) depends only on its scale s, one of the
scale format's codes, and on the tensor's D. So one small launch per tensor amax
(`encode_table_kernel`, which first reduces the amax pass's partial maxima) evaluates it for
every code (and the tensor's block factor G * fl(1 / E), and G * fl(1 / 4) for
four-over-six's second candidate) into a table,
`ENCODE_TABLE` float32 values, in the reference's order of operations; the quantize kernels
round each block's scale onto the grid as before and look its multiplier up by the scale code.
The bits are those of the formula (the same float32 operations on the same operands); what
moves is the correctly rounded division, from every block of every program to 256 lanes of one
program.

A spec with an outer block (`QuantSpec.outer_block`, TetraJet-v2's FP32 scale per 128 values)
has one A per outer block, which lies within a quantize kernel's tile: `outer_block_scales`
evaluates the same formulas per block from its outer block's amax, without a table.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_ops import FLOAT32_MAX, round_unsigned_minifloat

SCALE_CODES = tl.constexpr(256)  # every code a uint8 scale can hold
BLOCK_ENCODE_SLOT = tl.constexpr(256)  # G * fl(1 / E), after the multipliers
FOUR_ENCODE_SLOT = tl.constexpr(257)  # G * fl(1 / 4): four-over-six's candidate scaled to 4
ENCODE_TABLE = tl.constexpr(258)


@triton.jit
def _quotient(numerator, denominator):
    """numerator / denominator (correctly rounded) for positive numerators, +inf where the
    denominator is 0 (without dividing by zero)."""
    nonzero = denominator > 0
    quotient = tl.div_rn(numerator, tl.where(nonzero, denominator, 1.0))
    return tl.where(nonzero, quotient, float("inf"))


@triton.jit
def global_scales(amax, TWO_LEVEL_TARGET: tl.constexpr):
    """(G, D) of finite amaxes A: G = min(S * E / A, FLT_MAX), D = 1 / G."""
    target = tl.full(amax.shape, TWO_LEVEL_TARGET, tl.float32)
    global_encode = tl.minimum(_quotient(target, amax), FLOAT32_MAX)
    return global_encode, tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), global_encode)


@triton.jit
def block_encode(global_encode, ELEM_INV: tl.constexpr, FOUR: tl.constexpr):
    """A block scale's factor from G: G * fl(1 / E), or G * fl(1 / 4) (FOUR: four-over-six's
    candidate scaled to 4)."""
    if FOUR:  # noqa: SIM108 (a constexpr branch)
        factor = global_encode * 0.25
    else:
        factor = global_encode * ELEM_INV
    return factor


@triton.jit
def encode_multiplier(scale, global_decode):
    """e = min(1 / (s * D), FLT_MAX) of scale values s; a zero scale (or s * D under the
    float32 range) divides by zero: +inf, then FLT_MAX."""
    ones = tl.full(scale.shape, 1.0, tl.float32)
    return tl.minimum(tl.div_rn(ones, scale * global_decode), FLOAT32_MAX)


@triton.jit
def two_level_scales(
    amax, encode_table_ptr, SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX: tl.constexpr, CEIL: tl.constexpr, FOUR: tl.constexpr = False,
):  # fmt: skip
    """(scale values, scale codes, encode multipliers) of blocks with these finite amaxes, from
    their tensor's table (`encode_table_kernel`): s = round(min(a * (G * fl(1 / E)), S)) onto
    the scale grid (FOUR: G * fl(1 / 4), four-over-six's candidate), then e looked up by s's
    code."""
    if FOUR:
        block_encode = tl.load(encode_table_ptr + FOUR_ENCODE_SLOT)
    else:
        block_encode = tl.load(encode_table_ptr + BLOCK_ENCODE_SLOT)
    # min(min(a * (G * fl(1/E)), FLT_MAX), S) in one: the product is never NaN
    raw = tl.minimum(amax * block_encode, SCALE_MAX)
    scale, scale_code = round_unsigned_minifloat(
        raw, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, CEIL, True
    )
    return scale, scale_code, tl.load(encode_table_ptr + scale_code)


@triton.jit
def outer_block_scales(
    amax, outer_amax, SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX: tl.constexpr, CEIL: tl.constexpr, TWO_LEVEL_TARGET: tl.constexpr,
    ELEM_INV: tl.constexpr, FOUR: tl.constexpr = False,
):  # fmt: skip
    """`two_level_scales` of blocks whose A is their outer block's finite amax (`outer_amax`,
    shaped like `amax`): the table's formulas per block."""
    global_encode, global_decode = global_scales(outer_amax, TWO_LEVEL_TARGET)
    raw = tl.minimum(amax * block_encode(global_encode, ELEM_INV, FOUR), SCALE_MAX)
    scale, scale_code = round_unsigned_minifloat(
        raw, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, CEIL, True
    )
    return scale, scale_code, encode_multiplier(scale, global_decode)
