"""Fused block quantization of E2M1 tensors: one read of the input, one write of the result.

A program takes a tile of lines x positions along the quantization axis (`tile_io`), optionally
applies the random Hadamard transform to it, computes each block's scale, rounds (nearest-even
or stochastic) and writes either packed E2M1 codes and scale codes, or the dequantized values
(the fake-quantization path), along the input's last axis or any other.

Two-level (tensor-scaled) specs first reduce the tensor's amax with `_amax_kernel` (one read);
a tensor small enough for the L2 cache is then read the second time from there.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.dequantize import dequantize_tile
from fp4cli.kernels.tile_io import (
    line_mask,
    load_tile,
    seed_of,
    sr_bits,
    store_codes,
    store_values,
    tile_origin,
)
from fp4cli.kernels.tile_ops import (
    FLOAT32_MAX,
    e2m1_code_rne,
    e2m1_code_sr,
    e8m0_exponent,
    hadamard_rows,
    pow2,
    round_unsigned_minifloat,
)


@triton.jit
def transformed_tile(
    x_ptr,
    first_line,
    first_pos,
    outer,
    first_inner,
    lines,
    length,
    inner,
    rht_seed_ptr,
    rht_seed_value,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    RHT_SEED_FROM_PTR: tl.constexpr,
    HADAMARD: tl.constexpr,
    LOG2_HADAMARD: tl.constexpr,
    HADAMARD_NORM: tl.constexpr,
):
    """The float32 tile at the origin, Hadamard-transformed along the axis when HADAMARD > 0."""
    x = load_tile(
        x_ptr, first_line, first_pos, outer, first_inner, lines, length, inner,
        ROWS, COLS, TRANSPOSED,
    )  # fmt: skip
    if HADAMARD > 0:
        rht_seed = seed_of(rht_seed_ptr, rht_seed_value, RHT_SEED_FROM_PTR)
        x = hadamard_rows(x, rht_seed, ROWS, COLS, HADAMARD, LOG2_HADAMARD, HADAMARD_NORM)
    return x


@triton.jit
def quantize_tile(
    x,
    random_bits,
    tensor_scale,
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
    PRESCALE: tl.constexpr,
    TENSOR_SCALE: tl.constexpr,
):
    """E2M1 codes (sign included, int32 [ROWS, BLOCKS, BLOCK]; meaningless in non-finite
    blocks), scale values and scale codes ([ROWS, BLOCKS]) and which blocks are finite, for a
    float32 tile. The magnitude is scaled and rounded; the sign is x's."""
    BLOCKS: tl.constexpr = COLS // BLOCK
    # On the bits of |x|, one integer max per block gives both the amax and whether the block is
    # finite (NaN and Inf have the largest magnitude bits). A non-finite block's codes are
    # discarded on storing, so its values need no cleaning. Scaling by a positive tensor scale
    # commutes with the max (rounding is monotonic): the amax of x * ts is amax(x) * ts.
    bits = tl.reshape(x.to(tl.int32, bitcast=True), (ROWS, BLOCKS, BLOCK))
    magnitude_bits = bits & 0x7FFFFFFF
    amax_bits = tl.max(magnitude_bits, axis=2)
    finite_blocks = amax_bits < 0x7F800000
    amax = tl.where(finite_blocks, amax_bits, 0).to(tl.float32, bitcast=True)
    magnitude = magnitude_bits.to(tl.float32, bitcast=True)
    if TENSOR_SCALE:
        magnitude = magnitude * tensor_scale
        amax = amax * tensor_scale
    if POW2_SCALE:
        exponent = e8m0_exponent(amax, 2, 0x400000, CEIL)  # E2M1: 6 = 1.5 * 2^2
        scale = pow2(exponent)
        scale_code = exponent + 127
        magnitude = magnitude * pow2(-exponent)[:, :, None]
    else:
        raw = tl.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32))
        scale, scale_code = round_unsigned_minifloat(
            raw, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, CEIL
        )
        magnitude = tl.div_rn(magnitude, tl.broadcast_to(scale[:, :, None], magnitude.shape))
    if PRESCALE != 1.0:
        magnitude = magnitude * PRESCALE
    if SR:
        code = e2m1_code_sr(magnitude, tl.reshape(random_bits, (ROWS, BLOCKS, BLOCK)))
    else:
        code = e2m1_code_rne(magnitude)
    # The sign bit joins a non-zero code: (code + 7) & 8 is 8 exactly for codes 1..7.
    code = code | ((bits >> 28) & (code + 7) & 8)
    scale_code = tl.where(finite_blocks, scale_code, SCALE_NAN)
    return code, scale, scale_code, finite_blocks


@triton.jit(do_not_specialize=["seed_value", "rht_seed_value"])
def quantize_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    tensor_scale_ptr,
    seed_ptr,
    seed_value,
    rht_seed_ptr,
    rht_seed_value,
    lines,
    length,
    inner,
    out_length,
    padded_length,
    tiles_along,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    POW2_SCALE: tl.constexpr,
    CEIL: tl.constexpr,
    SCALE_MBITS: tl.constexpr,
    SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX: tl.constexpr,
    SCALE_NAN: tl.constexpr,
    SR: tl.constexpr,
    GROUPED: tl.constexpr,
    SEED_FROM_PTR: tl.constexpr,
    RHT_SEED_FROM_PTR: tl.constexpr,
    PRESCALE: tl.constexpr,
    TENSOR_SCALE: tl.constexpr,
    HADAMARD: tl.constexpr,
    LOG2_HADAMARD: tl.constexpr,
    HADAMARD_NORM: tl.constexpr,
    WRITE_VALUES: tl.constexpr,
):
    pid = tl.program_id(0)
    first_line, first_pos, outer, first_inner = tile_origin(
        pid, inner, tiles_along, ROWS, COLS, TRANSPOSED
    )
    rows_ok = line_mask(first_line, first_inner, lines, inner, ROWS, TRANSPOSED)
    x = transformed_tile(
        x_ptr, first_line, first_pos, outer, first_inner, lines, length, inner,
        rht_seed_ptr, rht_seed_value, ROWS, COLS, TRANSPOSED, RHT_SEED_FROM_PTR,
        HADAMARD, LOG2_HADAMARD, HADAMARD_NORM,
    )  # fmt: skip
    random_bits = x
    if SR:
        seed = seed_of(seed_ptr, seed_value, SEED_FROM_PTR)
        random_bits = sr_bits(
            seed,
            first_line,
            first_pos,
            outer,
            first_inner,
            inner,
            out_length,
            ROWS,
            COLS,
            TRANSPOSED,
            GROUPED,
        )
    tensor_scale = 1.0
    if TENSOR_SCALE:
        tensor_scale = tl.load(tensor_scale_ptr)
    code, scale, scale_code, finite_blocks = quantize_tile(
        x,
        random_bits,
        tensor_scale,
        ROWS,
        COLS,
        BLOCK,
        POW2_SCALE,
        CEIL,
        SCALE_MBITS,
        SCALE_MIN_EXP,
        SCALE_MAX,
        SCALE_NAN,
        SR,
        PRESCALE,
        TENSOR_SCALE,
    )
    if WRITE_VALUES:
        values = dequantize_tile(code, scale, finite_blocks, tensor_scale, PRESCALE, TENSOR_SCALE)
        store_values(
            out_ptr,
            tl.reshape(values, (ROWS, COLS)),
            first_line,
            first_pos,
            outer,
            first_inner,
            rows_ok,
            out_length,
            inner,
            ROWS,
            COLS,
            TRANSPOSED,
        )
    else:
        store_codes(
            codes_ptr,
            scales_ptr,
            code,
            scale_code,
            finite_blocks,
            first_line,
            first_pos,
            rows_ok,
            padded_length,
            ROWS,
            COLS,
            BLOCK,
        )


@triton.jit(do_not_specialize=["rht_seed_value"])
def amax_kernel(
    x_ptr,
    amax_ptr,
    rht_seed_ptr,
    rht_seed_value,
    lines,
    length,
    inner,
    tiles_along,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    SEED_FROM_PTR: tl.constexpr,
    HADAMARD: tl.constexpr,
    LOG2_HADAMARD: tl.constexpr,
    HADAMARD_NORM: tl.constexpr,
):
    """The largest finite |x| (after the Hadamard transform, if any) into amax_ptr."""
    pid = tl.program_id(0)
    first_line, first_pos, outer, first_inner = tile_origin(
        pid, inner, tiles_along, ROWS, COLS, TRANSPOSED
    )
    x = transformed_tile(
        x_ptr, first_line, first_pos, outer, first_inner, lines, length, inner,
        rht_seed_ptr, rht_seed_value, ROWS, COLS, TRANSPOSED, SEED_FROM_PTR,
        HADAMARD, LOG2_HADAMARD, HADAMARD_NORM,
    )  # fmt: skip
    magnitude = tl.abs(x)
    magnitude = tl.where(magnitude <= FLOAT32_MAX, magnitude, 0.0)
    tl.atomic_max(amax_ptr, tl.max(tl.max(magnitude, axis=1), axis=0))
