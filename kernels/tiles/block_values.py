"""A block's values from its grid values and scale, as the reference dequantizes: q * s (q * s *
the tensor scale under two-level scaling), then over the SR pre-scale, correctly rounded
(`tiles.prescale` says how). The dequantize kernel and the quantize kernels' fake-quantized
values both take them here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.prescale import REMAINDER_SCALES

SCALE_LOW = tl.constexpr(REMAINDER_SCALES[0])
SCALE_HIGH = tl.constexpr(REMAINDER_SCALES[1])


@triton.jit
def remainder_quotient(values, scale, finite_blocks, PRESCALE: tl.constexpr,
                       PRESCALE_INV: tl.constexpr):  # fmt: skip
    """values / PRESCALE correctly rounded, by `tiles.prescale`'s remainder step where every
    finite block's nonzero scale lies in REMAINDER_SCALES, else (for the whole tile) a division.
    The remainder is taken as y * p - x, and signs are flipped by multiplying by -1 (Triton's
    unary minus is 0 - x, which gives +0 for -(+0)), so that a zero keeps its sign."""
    p = tl.full(values.shape, PRESCALE, tl.float32)
    outside = finite_blocks & (scale != 0.0) & ~((scale >= SCALE_LOW) & (scale <= SCALE_HIGH))
    if tl.max(outside.to(tl.int32)) == 0:
        quotient = values * PRESCALE_INV
        remainder = tl.fma(quotient, p, values * -1.0)
        values = tl.fma(remainder, tl.full(values.shape, -PRESCALE_INV, tl.float32), quotient)
    else:
        values = tl.div_rn(values, p)
    return values


@triton.jit
def scaled_grid(
    grid,
    scale,
    finite_blocks,
    tensor_amax,
    PRESCALE: tl.constexpr,
    TENSOR_SCALE: tl.constexpr,
    DECODE_INV: tl.constexpr,
    BLOCK_AXIS: tl.constexpr,
    PRESCALE_INV: tl.constexpr,
    PRESCALE_FIX: tl.constexpr,
    PRESCALE_FIX_RATIO: tl.constexpr,
    PRESCALE_REMAINDER: tl.constexpr,
):
    """Signed grid values q (`elements.signed_value` of the codes, or the rounding's own) in
    blocks (`quantize_tile.block_view`: [ROWS, BLOCKS, BLOCK] for BLOCK_AXIS 1,
    [BLOCKS, BLOCK, COLS] for 0; scales and finite_blocks without the BLOCK axis), dequantized:
    q * scale (two-level: q * ((scale * tensor amax) * DECODE_INV)), then over the pre-scale,
    correctly rounded: a multiplication by PRESCALE_INV where `tiles.prescale` found it exact
    (PRESCALE_FIX_RATIO for the one magnitude PRESCALE_FIX it misses), its remainder step
    (PRESCALE_REMAINDER) on a tile whose block scales it covers, else a division; NaN in
    non-finite blocks."""
    if TENSOR_SCALE:
        scale = (scale * tensor_amax) * DECODE_INV
    values = grid * tl.expand_dims(scale, BLOCK_AXIS + 1)
    if PRESCALE_REMAINDER:
        values = remainder_quotient(values, scale, finite_blocks, PRESCALE, PRESCALE_INV)
    elif PRESCALE != 1.0 and PRESCALE_INV != 0.0:
        if PRESCALE_FIX != 0.0:  # a float32 constant: a subnormal literal would be float64
            fix = tl.full(values.shape, PRESCALE_FIX, tl.float32)
            values = values * tl.where(tl.abs(values) == fix, PRESCALE_FIX_RATIO, PRESCALE_INV)
        else:
            values = values * PRESCALE_INV
    elif PRESCALE != 1.0:
        values = tl.div_rn(values, tl.full(values.shape, PRESCALE, tl.float32))
    return tl.where(tl.expand_dims(finite_blocks, BLOCK_AXIS + 1), values, float("nan"))
