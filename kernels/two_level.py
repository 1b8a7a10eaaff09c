"""Two-level block scales in the kernels: `fp4cli.quant.two_level`'s formulas, per tensor once.

A block's encode multiplier e = min(1 / (s * D), FLT_MAX) depends only on its scale s, one of the
scale format's codes, and on the tensor's D. So one small launch per tensor amax
(`encode_table_kernel`) evaluates it for every code (and the tensor's block factor
G * fl(1 / E), and G * fl(1 / 4) for four-over-six's second candidate) into a table,
`ENCODE_TABLE` float32 values, in the reference's order of operations; the quantize kernels
round each block's scale onto the grid as before and look its multiplier up by the scale code.
The bits are those of the formula (the same float32 operations on the same operands); what
moves is the correctly rounded division, from every block of every program to 256 lanes of one
program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tile_ops import FLOAT32_MAX, round_unsigned_minifloat, unsigned_minifloat_value

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
def write_table(
    tensor_amax, table, SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX_CODE: tl.constexpr, TWO_LEVEL_TARGET: tl.constexpr, ELEM_INV: tl.constexpr,
):  # fmt: skip
    """The table of a tensor of finite amax A (a scalar) at `table`: G = min(S * E / A,
    FLT_MAX), D = 1 / G; entry c is min(1 / (s_c * D), FLT_MAX) for the scale value s_c of code
    c, entry BLOCK_ENCODE_SLOT is G * fl(1 / E), entry FOUR_ENCODE_SLOT G * fl(1 / 4)."""
    target = tl.full(tensor_amax.shape, TWO_LEVEL_TARGET, tl.float32)
    global_encode = tl.minimum(_quotient(target, tensor_amax), FLOAT32_MAX)
    global_decode = tl.div_rn(tl.full(tensor_amax.shape, 1.0, tl.float32), global_encode)
    codes = tl.arange(0, SCALE_CODES)
    # codes past the format's largest are never looked up: they repeat the largest's entry
    largest = tl.minimum(codes, SCALE_MAX_CODE)
    scale = unsigned_minifloat_value(largest, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX_CODE)
    # a zero scale (or s * D under the float32 range) divides by zero: +inf, then FLT_MAX
    ones = tl.full(scale.shape, 1.0, tl.float32)
    multiplier = tl.minimum(tl.div_rn(ones, scale * global_decode), FLOAT32_MAX)
    tl.store(table + codes, multiplier)
    tl.store(table + BLOCK_ENCODE_SLOT, global_encode * ELEM_INV)
    tl.store(table + FOUR_ENCODE_SLOT, global_encode * 0.25)


@triton.jit
def encode_table_kernel(
    amax_ptr, table_ptr, SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX_CODE: tl.constexpr, TWO_LEVEL_TARGET: tl.constexpr, ELEM_INV: tl.constexpr,
):  # fmt: skip
    """Program t: the table of the tensor whose amax is amax_ptr[t], into row t of table_ptr."""
    tensor = tl.program_id(0)
    write_table(
        tl.load(amax_ptr + tensor), table_ptr + tensor * ENCODE_TABLE, SCALE_MBITS,
        SCALE_MIN_EXP, SCALE_MAX_CODE, TWO_LEVEL_TARGET, ELEM_INV,
    )  # fmt: skip


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
