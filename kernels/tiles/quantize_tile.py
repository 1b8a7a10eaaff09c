"""Quantizing a register tile: each block's scale, its elements' codes and the signs, as
`fp4cli.quant.quantize` computes them (`quantize_tile`), for blocks along either axis of the
tile. The single-direction kernel (`quantization.quantize`) and both directions of the pair
kernel (`quantization.quantize_pair`) quantize their tiles here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.elements import (
    code_away,
    code_guided,
    code_rne,
    code_sr,
    rne_grid,
    signed_value,
    sr_grid,
)
from fp4cli.kernels.tiles.four_over_six import prefer_four
from fp4cli.kernels.tiles.ms_eden import eden_scales
from fp4cli.kernels.tiles.tile_ops import (
    e8m0_exponent,
    outer_reduce,
    pow2,
    round_unsigned_minifloat,
    square_reduce,
)
from fp4cli.kernels.tiles.two_level import outer_block_scales, two_level_scales


@triton.jit
def block_view(tile, ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr,
               BLOCK_AXIS: tl.constexpr):  # fmt: skip
    """A [ROWS, COLS] tile as blocks: [ROWS, COLS / BLOCK, BLOCK] for blocks along its last
    axis (BLOCK_AXIS 1), [ROWS / BLOCK, BLOCK, COLS] along its first (BLOCK_AXIS 0)."""
    if BLOCK_AXIS == 1:
        blocks = tl.reshape(tile, (ROWS, COLS // BLOCK, BLOCK))
    else:
        blocks = tl.reshape(tile, (ROWS // BLOCK, BLOCK, COLS))
    return blocks


@triton.jit
def scaled_blocks(
    magnitude, guide_units, amax, encode_table_ptr, BLOCK_AXIS: tl.constexpr,
    POW2_SCALE: tl.constexpr, CEIL: tl.constexpr, SCALE_MBITS: tl.constexpr,
    SCALE_MIN_EXP: tl.constexpr, SCALE_MAX: tl.constexpr, PRESCALE: tl.constexpr,
    TENSOR_SCALE: tl.constexpr, GUIDED: tl.constexpr, E1M2: tl.constexpr, FOUR: tl.constexpr,
    outer_amax, OUTER: tl.constexpr, TWO_LEVEL_TARGET: tl.constexpr, ELEM_INV: tl.constexpr,
):  # fmt: skip
    """(scale values, scale codes, magnitudes in grid units, guide in grid units) of blocks
    (`block_view`; amaxes without the block axis) whose amax maps onto the element format's
    largest value, or onto 4 (FOUR: four-over-six's second candidate). The magnitudes take the
    pre-scale, the guide does not. OUTER (two-level): each block's A is `outer_amax`'s."""
    if TENSOR_SCALE:
        if OUTER > 0:
            scale, scale_code, multiplier = outer_block_scales(
                amax, outer_amax, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, CEIL,
                TWO_LEVEL_TARGET, ELEM_INV, FOUR,
            )  # fmt: skip
        else:
            scale, scale_code, multiplier = two_level_scales(
                amax, encode_table_ptr, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, CEIL, FOUR
            )
        per_value = tl.broadcast_to(tl.expand_dims(multiplier, BLOCK_AXIS + 1), magnitude.shape)
        magnitude = magnitude * per_value
        if GUIDED:
            guide_units = guide_units * per_value
    elif POW2_SCALE:
        if FOUR:  # 4 = 1 * 2^2
            exponent = e8m0_exponent(amax, 2, 0, CEIL)
        elif E1M2:  # 3.5 = 1.75 * 2^1
            exponent = e8m0_exponent(amax, 1, 0x600000, CEIL)
        else:  # E2M1: 6 = 1.5 * 2^2
            exponent = e8m0_exponent(amax, 2, 0x400000, CEIL)
        scale = pow2(exponent)
        scale_code = exponent + 127
        inverse = tl.expand_dims(pow2(-exponent), BLOCK_AXIS + 1)
        magnitude = magnitude * inverse
        if GUIDED:
            guide_units = guide_units * inverse
    else:
        if FOUR:
            raw = tl.div_rn(amax, tl.full(amax.shape, 4.0, tl.float32))
        elif E1M2:
            raw = tl.div_rn(amax, tl.full(amax.shape, 3.5, tl.float32))
        else:
            raw = tl.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32))
        scale, scale_code = round_unsigned_minifloat(
            raw, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, CEIL, False
        )
        per_value = tl.broadcast_to(tl.expand_dims(scale, BLOCK_AXIS + 1), magnitude.shape)
        magnitude = tl.div_rn(magnitude, per_value)
        if GUIDED:
            guide_units = tl.div_rn(guide_units, per_value)
    if PRESCALE != 1.0:
        magnitude = magnitude * PRESCALE
    return scale, scale_code, magnitude, guide_units


@triton.jit
def rounded_codes(
    magnitude, guide_units, bits, random_bits, ROWS: tl.constexpr, COLS: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_AXIS: tl.constexpr, SR: tl.constexpr, AWAY: tl.constexpr,
    GUIDED: tl.constexpr, RAW_SIGN: tl.constexpr, GRID: tl.constexpr, E1M2: tl.constexpr,
):  # fmt: skip
    """The signed codes (GRID: signed grid values) of magnitudes in grid units, x's sign from
    its `bits`, rounded as `quantize_tile` says."""
    if GRID and not (GUIDED or AWAY):
        if SR:
            grid = sr_grid(magnitude, block_view(random_bits, ROWS, COLS, BLOCK, BLOCK_AXIS), E1M2,
                           SR)  # fmt: skip
        else:
            grid = rne_grid(magnitude, E1M2)
        # x's sign on a non-zero value, as `signed_value` of the code
        signed_bits = grid.to(tl.int32, bitcast=True) | (bits & -2147483648)
        code = tl.where(grid > 0.0, signed_bits.to(tl.float32, bitcast=True), 0.0)
    else:
        if GUIDED:  # the guide on x's side of zero
            code = code_guided(magnitude, tl.where(bits < 0, -guide_units, guide_units), E1M2)
        elif SR:
            code = code_sr(magnitude, block_view(random_bits, ROWS, COLS, BLOCK, BLOCK_AXIS), E1M2,
                           SR)  # fmt: skip
        elif AWAY:
            code = code_away(magnitude, E1M2)
        else:
            code = code_rne(magnitude, E1M2)
        sign = (bits >> 28) & 8
        if not RAW_SIGN:  # the sign bit joins a non-zero code: (code + 7) & 8 is 8 for 1..7
            sign = sign & (code + 7)
        code = code | sign
        if GRID:
            code = signed_value(code, E1M2)
    return code


@triton.jit
def quantize_tile(
    x,
    random_bits,
    guide,
    encode_table_ptr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
    POW2_SCALE: tl.constexpr,
    CEIL: tl.constexpr,
    SCALE_MBITS: tl.constexpr,
    SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX: tl.constexpr,
    SCALE_NAN: tl.constexpr,
    SR: tl.constexpr,
    AWAY: tl.constexpr,
    PRESCALE: tl.constexpr,
    TENSOR_SCALE: tl.constexpr,
    GUIDED: tl.constexpr,
    BLOCK_AXIS: tl.constexpr,
    TILE2D: tl.constexpr,
    RAW_SIGN: tl.constexpr,
    GRID: tl.constexpr = False,
    E1M2: tl.constexpr = False,
    FOUR_OVER_SIX: tl.constexpr = False,
    tensor_amax=0.0,
    DECODE_INV: tl.constexpr = 1.0,
    OUTER: tl.constexpr = 0,
    TWO_LEVEL_TARGET: tl.constexpr = 0.0,
    ELEM_INV: tl.constexpr = 0.0,
    EDEN: tl.constexpr = 0,
    PRESCALE_INV: tl.constexpr = 0.0,
    PRESCALE_FIX: tl.constexpr = 0.0,
    PRESCALE_FIX_RATIO: tl.constexpr = 0.0,
    PRESCALE_REMAINDER: tl.constexpr = False,
):
    """E2M1 codes (sign included, int32; meaningless in non-finite blocks), scale values and
    scale codes, and which blocks are finite, for a float32 [ROWS, COLS] tile whose blocks run
    along its last axis (BLOCK_AXIS 1: codes [ROWS, COLS / BLOCK, BLOCK], the rest
    [ROWS, COLS / BLOCK]) or its first (BLOCK_AXIS 0: codes [ROWS / BLOCK, BLOCK, COLS], the
    rest [ROWS / BLOCK, COLS]). The magnitude is scaled and rounded (SR: stochastically with
    `random_bits`; AWAY: to nearest, ties away from zero; else ties to even); the sign is x's.
    GUIDED: rounded toward the float32 `guide` tile (Q-EMA), scaled like x but without the
    pre-scale.
    TENSOR_SCALE: two-level scaling relative to the tensor's amax (`fp4cli.quant.two_level`),
    by the tensor's table at encode_table_ptr (`encode_table.encode_table_kernel`).
    TILE2D: each block's scale is its BLOCK x BLOCK square's (the tile's origin and sides are
    multiples of BLOCK). RAW_SIGN: a negative value's sign joins its code even where the code
    is 0 (code 8, which `store_codes` turns back into 0 eight codes at a time); else a value
    rounded to zero has code 0. GRID (for the dequantized values): the signed grid values
    `elements.signed_value(code)` (float32) in place of the codes, straight from the rounding
    for RNE and SR. E1M2: the uniform grid's codes and values instead of E2M1's
    (`elements`). FOUR_OVER_SIX: each block (square) also quantized with its amax onto 4, and
    keeps the nearer candidate (`four_over_six`, the candidates decoded over the pre-scale with
    PRESCALE and PRESCALE_INV .. PRESCALE_REMAINDER as `scaled_grid`; FOUR_OVER_SIX_ESTIMATE: its
    float32 estimate first, FOUR_OVER_SIX_EXACT: the exact errors alone, FOUR_OVER_SIX_MAE:
    the exact absolute errors), decoded with
    `tensor_amax` and DECODE_INV under TENSOR_SCALE. OUTER (> 0, with TENSOR_SCALE): A is each
    run of OUTER blocks' largest finite |x| (`QuantSpec.outer_block`; the tile's extent along
    the blocks is a multiple of OUTER * BLOCK) instead of `tensor_amax`, with the formulas'
    constants TWO_LEVEL_TARGET and ELEM_INV. Also returns the A each block was scaled by. EDEN (> 0,
    with TENSOR_SCALE and AWAY): MS-EDEN, each block's scale corrected over its group of EDEN
    blocks (`ms_eden.eden_scales`), `random_bits` then one word per block (its first
    element's)."""
    # On the bits of |x|, one integer max per block gives both the amax and whether the block is
    # finite (NaN and Inf have the largest magnitude bits). A non-finite block's codes are
    # discarded on storing, so its values need no cleaning.
    bits = block_view(x.to(tl.int32, bitcast=True), ROWS, COLS, BLOCK, BLOCK_AXIS)
    magnitude_bits = bits & 0x7FFFFFFF
    amax_bits = tl.max(magnitude_bits, axis=BLOCK_AXIS + 1)
    if TILE2D:
        amax_bits = square_reduce(amax_bits, ROWS, COLS, BLOCK, BLOCK_AXIS, False)
    finite_blocks = amax_bits < 0x7F800000
    amax = tl.where(finite_blocks, amax_bits, 0).to(tl.float32, bitcast=True)
    magnitude = magnitude_bits.to(tl.float32, bitcast=True)
    finite_values = magnitude_bits < 0x7F800000
    if OUTER > 0 or EDEN > 0:  # over the finite elements, a non-finite block's included
        finite_bits = tl.where(finite_values, magnitude_bits, 0)
        element_amax = tl.max(finite_bits, axis=BLOCK_AXIS + 1).to(tl.float32, bitcast=True)
        if OUTER > 0:
            tensor_amax = outer_reduce(element_amax, ROWS, COLS, BLOCK, OUTER, BLOCK_AXIS)
        if EDEN > 0:  # a non-finite block's scale joins its group's sums, as the reference's
            amax = element_amax
    guide_units = magnitude
    if GUIDED:
        guide_units = block_view(guide, ROWS, COLS, BLOCK, BLOCK_AXIS)
    scale, scale_code, units, guide_grid = scaled_blocks(
        magnitude, guide_units, amax, encode_table_ptr, BLOCK_AXIS, POW2_SCALE, CEIL,
        SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, PRESCALE, TENSOR_SCALE, GUIDED, E1M2, False,
        tensor_amax, OUTER, TWO_LEVEL_TARGET, ELEM_INV,
    )  # fmt: skip
    code = rounded_codes(units, guide_grid, bits, random_bits, ROWS, COLS, BLOCK, BLOCK_AXIS,
                         SR, AWAY, GUIDED, RAW_SIGN, GRID, E1M2)  # fmt: skip
    if EDEN > 0:
        grid = code
        if not GRID:
            grid = signed_value(code, E1M2)
        scale, scale_code = eden_scales(
            units, tl.abs(grid), finite_values, scale, scale_code, random_bits, ROWS, COLS,
            BLOCK, EDEN, BLOCK_AXIS, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX,
        )  # fmt: skip
    if FOUR_OVER_SIX:
        scale4, scale_code4, units4, guide_grid4 = scaled_blocks(
            magnitude, guide_units, amax, encode_table_ptr, BLOCK_AXIS, POW2_SCALE, CEIL,
            SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, PRESCALE, TENSOR_SCALE, GUIDED, E1M2, True,
            tensor_amax, OUTER, TWO_LEVEL_TARGET, ELEM_INV,
        )  # fmt: skip
        code4 = rounded_codes(units4, guide_grid4, bits, random_bits, ROWS, COLS, BLOCK,
                              BLOCK_AXIS, SR, AWAY, GUIDED, RAW_SIGN, GRID, E1M2)  # fmt: skip
        four = prefer_four(
            bits.to(tl.float32, bitcast=True), code, code4, scale, scale4, finite_blocks,
            amax_bits, tensor_amax, ROWS, COLS, BLOCK, BLOCK_AXIS, TENSOR_SCALE, DECODE_INV,
            TILE2D, GRID, E1M2, FOUR_OVER_SIX, PRESCALE, PRESCALE_INV, PRESCALE_FIX,
            PRESCALE_FIX_RATIO, PRESCALE_REMAINDER,
        )  # fmt: skip
        code = tl.where(tl.expand_dims(four, BLOCK_AXIS + 1), code4, code)
        scale = tl.where(four, scale4, scale)
        scale_code = tl.where(four, scale_code4, scale_code)
    scale_code = tl.where(finite_blocks, scale_code, SCALE_NAN)
    return code, scale, scale_code, finite_blocks, tensor_amax
