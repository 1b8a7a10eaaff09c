"""Dequantization of packed 4-bit codes (E2M1, or E1M2) and block scales (axis-last padded
layout) back to a tensor in its own layout; each tile's values are `tiles.block_values`'s, as
the quantize kernels' fake-quantized values are."""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.block_values import scaled_grid
from fp4cli.kernels.tiles.elements import signed_value
from fp4cli.kernels.tiles.tile_io import line_mask, store_values, tile_origin
from fp4cli.kernels.tiles.tile_ops import e8m0_scale, unsigned_minifloat_value


@triton.jit
def dequantize_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    tensor_amax_ptr,
    lines,
    inner,
    out_length,
    padded_length,
    tiles_along,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    POW2_SCALE: tl.constexpr,
    SCALE_MBITS: tl.constexpr,
    SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX_CODE: tl.constexpr,
    PRESCALE: tl.constexpr,
    PRESCALE_INV: tl.constexpr,
    PRESCALE_FIX: tl.constexpr,
    PRESCALE_FIX_RATIO: tl.constexpr,
    PRESCALE_REMAINDER: tl.constexpr,
    TENSOR_SCALE: tl.constexpr,
    DECODE_INV: tl.constexpr,
    E1M2: tl.constexpr,
    OUTER: tl.constexpr,
):
    """Packed E2M1 (E1M2: E1M2) codes and scale codes (axis-last padded layout) -> values in
    the tensor's own layout. OUTER (> 0, with TENSOR_SCALE): tensor_amax_ptr holds one amax
    per OUTER blocks of each line (`tile_io.store_outer_amax`'s layout)."""
    first_line, first_pos, outer, first_inner = tile_origin(
        inner, tiles_along, ROWS, COLS, TRANSPOSED
    )
    rows_ok = line_mask(first_line, first_inner, lines, inner, ROWS, TRANSPOSED)
    line_ids = first_line + tl.arange(0, ROWS)
    byte_cols = first_pos // 2 + tl.arange(0, COLS // 2)
    byte_mask = rows_ok[:, None] & (byte_cols < padded_length // 2)[None, :]
    packed = tl.load(
        codes_ptr + line_ids[:, None] * (padded_length // 2) + byte_cols[None, :],
        mask=byte_mask,
        other=0,
    ).to(tl.int32)
    code = tl.reshape(tl.join(packed & 15, packed >> 4), (ROWS, COLS // BLOCK, BLOCK))
    n_blocks = padded_length // BLOCK
    block_cols = first_pos // BLOCK + tl.arange(0, COLS // BLOCK)
    block_mask = rows_ok[:, None] & (block_cols < n_blocks)[None, :]
    scale_code = tl.load(
        scales_ptr + line_ids[:, None] * n_blocks + block_cols[None, :], mask=block_mask, other=0
    ).to(tl.int32)
    if POW2_SCALE:
        scale, finite_blocks = e8m0_scale(scale_code)
    else:
        scale = unsigned_minifloat_value(scale_code, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX_CODE)
        finite_blocks = scale_code <= SCALE_MAX_CODE
    tensor_amax = 0.0
    if TENSOR_SCALE and OUTER > 0:
        n_outer = (n_blocks + OUTER - 1) // OUTER
        tensor_amax = tl.load(
            tensor_amax_ptr + line_ids[:, None] * n_outer + block_cols[None, :] // OUTER,
            mask=block_mask, other=0.0,
        )  # fmt: skip
    elif TENSOR_SCALE:
        tensor_amax = tl.load(tensor_amax_ptr)
    values = scaled_grid(
        signed_value(code, E1M2), scale, finite_blocks, tensor_amax, PRESCALE, TENSOR_SCALE,
        DECODE_INV, 1, PRESCALE_INV, PRESCALE_FIX, PRESCALE_FIX_RATIO, PRESCALE_REMAINDER,
    )  # fmt: skip
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
