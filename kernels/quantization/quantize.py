"""Fused block quantization along any axis: one read of the input, one write of the result.

`quantize_kernel` takes a tile of lines x positions along the quantization axis (`tile_io`),
optionally applies the random Hadamard transform to it, quantizes it (`tiles.quantize_tile`:
each block's scale, its elements rounded to nearest with ties to even or away from zero, or
stochastically) and writes either packed codes and scale codes, or the dequantized values (the
fake-quantization path), along the input's last axis or any other.

Two-level (tensor-scaled) specs first reduce the tensor's finite amax with
`tensor_scale.amax.amax_kernel` (one read); a tensor small enough for the L2 cache is then
read the second time from there. The blocks' encode multipliers come from the tensor's table
(`tensor_scale.encode_table`); an outer block's (`QuantSpec.outer_block`) are computed in the
tile, and MS-EDEN corrects the scales there (`tiles.ms_eden`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.block_values import scaled_grid
from fp4cli.kernels.tiles.quantize_tile import quantize_tile
from fp4cli.kernels.tiles.tile_io import (
    block_first_bits,
    line_mask,
    seed_of,
    sr_bits,
    store_codes,
    store_outer_amax,
    store_values,
    tile_origin,
    transformed_tile,
)


@triton.jit(do_not_specialize=["seed_value", "rht_seed_value"])
def quantize_kernel(
    x_ptr,
    guide_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    tensor_amax_ptr,
    encode_table_ptr,
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
    AWAY: tl.constexpr,
    GROUPED: tl.constexpr,
    SEED_FROM_PTR: tl.constexpr,
    RHT_SEED_FROM_PTR: tl.constexpr,
    PRESCALE: tl.constexpr,
    PRESCALE_INV: tl.constexpr,
    PRESCALE_FIX: tl.constexpr,
    PRESCALE_FIX_RATIO: tl.constexpr,
    PRESCALE_REMAINDER: tl.constexpr,
    TENSOR_SCALE: tl.constexpr,
    DECODE_INV: tl.constexpr,
    HADAMARD: tl.constexpr,
    LOG2_HADAMARD: tl.constexpr,
    HADAMARD_NORM: tl.constexpr,
    HADAMARD_SIGNS: tl.constexpr,
    WRITE_VALUES: tl.constexpr,
    GUIDED: tl.constexpr,
    E1M2: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr,
    OUTER: tl.constexpr,
    TWO_LEVEL_TARGET: tl.constexpr,
    ELEM_INV: tl.constexpr,
    EDEN: tl.constexpr,
    SIGNED_ZERO: tl.constexpr,
):
    """Quantize x along one axis in blocks of BLOCK positions, each with its own scale: write
    packed codes and scale codes, or (WRITE_VALUES) the dequantized values in x's layout.

    x is seen as (lines, length, inner) around the axis: `lines` the product of the sizes
    before it, `inner` after it (1: the axis is x's last, not TRANSPOSED).

    Arguments:
      x_ptr             x, float32 / bfloat16 / float16, contiguous
      guide_ptr         GUIDED: Q-EMA's guide, x's shape and dtype (else None)
      codes_ptr         uint8 (lines * inner, padded_length / 2): two codes a byte, axis last
      scales_ptr        uint8 (lines * inner, padded_length / BLOCK): scale codes
      out_ptr           WRITE_VALUES: the values, x's shape with out_length along the axis
      tensor_amax_ptr   float32: the tensor amax (TENSOR_SCALE, OUTER 0), or with OUTER > 0
                        one amax per outer block, written (lines * inner, outer blocks)
      encode_table_ptr  float32 [ENCODE_TABLE]: the tensor's encode table (TENSOR_SCALE,
                        OUTER 0; `tensor_scale.encode_table`)
      seed_ptr, seed_value          SR's or MS-EDEN's seed (`tile_io.seed_of`)
      rht_seed_ptr, rht_seed_value  the Hadamard transform's seed
      lines, length, inner  x's sizes around the axis
      out_length        the axis after the transform (length padded to whole transforms)
      padded_length     out_length padded to whole blocks
      tiles_along       tiles along the axis (`tile_io.tile_origin`)
    Constexprs:
      ROWS, COLS        the tile: ROWS lines by COLS positions along the axis
      TRANSPOSED        the axis is not x's last (the tile is read along inner, turned in
                        registers)
      GROUPED           SR: one Philox call serves a group of positions (`tile_io.sr_bits`)
      SEED_FROM_PTR, RHT_SEED_FROM_PTR  each seed is read from its pointer
      HADAMARD, LOG2_HADAMARD, HADAMARD_NORM, HADAMARD_SIGNS  the transform (HADAMARD 0: none)
      WRITE_VALUES      values instead of codes and scale codes
      GUIDED            each value rounds toward the guide (Q-EMA) instead of by the spec
      SIGNED_ZERO       a negative value rounded to zero is code 8 (-0) in the packed codes
      the spec's        BLOCK, POW2_SCALE, CEIL, SCALE_*, SR, AWAY, EDEN, PRESCALE*,
                        TENSOR_SCALE, DECODE_INV, E1M2, FOUR_OVER_SIX, OUTER,
                        TWO_LEVEL_TARGET, ELEM_INV: `spec_constants` (kernels/README.md)

    One program's tile, ROWS lines by COLS positions (the grid: line tiles x tiles along the
    axis, the last split over the grid's second and third axes; TRANSPOSED: one axis):

                   first_pos                              first_pos + COLS
                       |<-- BLOCK -->|<-- BLOCK -->|     |<-- BLOCK -->|
        first_line     +-------------+-------------+ ... +-------------+
          ROWS lines   |  a scale    |  a scale    |     |  a scale    |
                       +-------------+-------------+ ... +-------------+
    """
    first_line, first_pos, outer, first_inner = tile_origin(
        inner, tiles_along, ROWS, COLS, TRANSPOSED
    )
    rows_ok = line_mask(first_line, first_inner, lines, inner, ROWS, TRANSPOSED)
    # A transform of 8 to 32 points along the last axis stays in each thread (`transformed_tile`
    # loads it as runs). Larger ones take the butterflies as sums where they write packed codes
    # (docs/fast-linear.md, "Hadamard transforms").
    by_sums: tl.constexpr = not (TRANSPOSED or WRITE_VALUES)
    x = transformed_tile(
        x_ptr, first_line, first_pos, outer, first_inner, lines, length, inner,
        rht_seed_ptr, rht_seed_value, ROWS, COLS, TRANSPOSED, RHT_SEED_FROM_PTR,
        HADAMARD, LOG2_HADAMARD, HADAMARD_NORM, BY_SUMS=by_sums, HADAMARD_SIGNS=HADAMARD_SIGNS,
    )  # fmt: skip
    guide = x
    if GUIDED:  # the guide goes through the same transform as x
        guide = transformed_tile(
            guide_ptr, first_line, first_pos, outer, first_inner, lines, length, inner,
            rht_seed_ptr, rht_seed_value, ROWS, COLS, TRANSPOSED, RHT_SEED_FROM_PTR,
            HADAMARD, LOG2_HADAMARD, HADAMARD_NORM, BY_SUMS=by_sums,
            HADAMARD_SIGNS=HADAMARD_SIGNS,
        )  # fmt: skip
    random_bits = x
    if SR:
        seed = seed_of(seed_ptr, seed_value, SEED_FROM_PTR)
        random_bits = sr_bits(
            seed, first_line, first_pos, outer, first_inner, inner, out_length, ROWS=ROWS,
            COLS=COLS, TRANSPOSED=TRANSPOSED, GROUPED=GROUPED, SR_BITS=SR,
        )  # fmt: skip
    if EDEN > 0:
        seed = seed_of(seed_ptr, seed_value, SEED_FROM_PTR)
        random_bits = block_first_bits(seed, first_line, first_pos, outer, first_inner, inner,
                                       out_length, ROWS, COLS, BLOCK, TRANSPOSED)  # fmt: skip
    tensor_amax = 0.0
    if TENSOR_SCALE and OUTER == 0:
        tensor_amax = tl.load(tensor_amax_ptr)
    code, scale, scale_code, finite_blocks, tensor_amax = quantize_tile(
        x, random_bits, guide, encode_table_ptr, ROWS=ROWS, COLS=COLS, BLOCK=BLOCK,
        POW2_SCALE=POW2_SCALE, CEIL=CEIL, SCALE_MBITS=SCALE_MBITS, SCALE_MIN_EXP=SCALE_MIN_EXP,
        SCALE_MAX=SCALE_MAX, SCALE_NAN=SCALE_NAN, SR=SR, AWAY=AWAY, PRESCALE=PRESCALE,
        TENSOR_SCALE=TENSOR_SCALE, GUIDED=GUIDED, BLOCK_AXIS=1, TILE2D=False,
        RAW_SIGN=not WRITE_VALUES, GRID=WRITE_VALUES, E1M2=E1M2, FOUR_OVER_SIX=FOUR_OVER_SIX,
        tensor_amax=tensor_amax, DECODE_INV=DECODE_INV, OUTER=OUTER,
        TWO_LEVEL_TARGET=TWO_LEVEL_TARGET, ELEM_INV=ELEM_INV, EDEN=EDEN,
        PRESCALE_INV=PRESCALE_INV, PRESCALE_FIX=PRESCALE_FIX,
        PRESCALE_FIX_RATIO=PRESCALE_FIX_RATIO, PRESCALE_REMAINDER=PRESCALE_REMAINDER,
    )  # fmt: skip
    if WRITE_VALUES:
        values = scaled_grid(
            code, scale, finite_blocks, tensor_amax, PRESCALE=PRESCALE,
            TENSOR_SCALE=TENSOR_SCALE, DECODE_INV=DECODE_INV, BLOCK_AXIS=1,
            PRESCALE_INV=PRESCALE_INV, PRESCALE_FIX=PRESCALE_FIX,
            PRESCALE_FIX_RATIO=PRESCALE_FIX_RATIO, PRESCALE_REMAINDER=PRESCALE_REMAINDER,
        )  # fmt: skip
        store_values(
            out_ptr, tl.reshape(values, (ROWS, COLS)), first_line, first_pos, outer,
            first_inner, rows_ok, out_length, inner, ROWS=ROWS, COLS=COLS, TRANSPOSED=TRANSPOSED,
        )  # fmt: skip
    else:
        store_codes(
            codes_ptr, scales_ptr, code, scale_code, finite_blocks, first_line, first_pos,
            rows_ok, padded_length, ROWS=ROWS, COLS=COLS, BLOCK=BLOCK, SIGNED_ZERO=SIGNED_ZERO,
        )  # fmt: skip
        if OUTER > 0:
            store_outer_amax(
                tensor_amax_ptr, tensor_amax, first_line, first_pos, rows_ok, padded_length,
                BLOCK_AXIS=1, LINES=ROWS, LENGTH=COLS, BLOCK=BLOCK, OUTER=OUTER,
            )  # fmt: skip
