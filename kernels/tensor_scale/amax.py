"""The tensor amax a two-level (NVFP4-style) spec scales by, from one read of the tensor.

`amax_kernel` reduces it along any axis after that axis's Hadamard transform (the
single-direction quantize kernel's tiles, `tile_io.transformed_tile`). `amax_pair_kernel`
loads [BR, BC] tiles of a 2-D tensor and reduces each direction's largest finite |value|: of
the tile, or of its Hadamard transform along that direction's axis (`hadamard_rows`,
`hadamard_cols`), any pair of directions. Its transforms move values between threads at their
wider butterfly stages; the commonest transformed pairs take the slab kernels of
`amax_slabs.py`, which move nothing.

Each program writes its maxima to the (directions, programs) partial maxima (`store_partial`):
no atomics on one float. The program that finishes a pair's pass last reduces them and writes
the encode tables (`encode_table.last_program_tables`), or a launch that follows does
(`encode_table.encode_table_kernel`), or torch where only the amax is wanted
(`launch_amax.pair_amax`, `launch.tensor_amax`): a maximum in any order is the same.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tensor_scale.encode_table import last_program_tables
from fp4cli.kernels.tiles.tile_io import (
    load_program_tile,
    rounded_to_bf16,
    seed_of,
    tile_origin,
    transformed_tile,
)
from fp4cli.kernels.tiles.tile_ops import FLOAT32_MAX, hadamard_cols, hadamard_rows


@triton.jit(do_not_specialize=["row_rht_seed_value", "col_rht_seed_value"])
def amax_pair_kernel(
    x_ptr, amax_ptr, row_rht_seed_ptr, row_rht_seed_value, col_rht_seed_ptr, col_rht_seed_value,
    rows, cols, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr,
    ROW_ON: tl.constexpr, ROW_RHT_SEED_FROM_PTR: tl.constexpr, ROW_HADAMARD: tl.constexpr,
    ROW_LOG2_HADAMARD: tl.constexpr, ROW_HADAMARD_NORM: tl.constexpr,
    ROW_HADAMARD_SIGNS: tl.constexpr,
    COL_ON: tl.constexpr, COL_RHT_SEED_FROM_PTR: tl.constexpr, COL_HADAMARD: tl.constexpr,
    COL_LOG2_HADAMARD: tl.constexpr, COL_HADAMARD_NORM: tl.constexpr,
    COL_HADAMARD_SIGNS: tl.constexpr, ROUND_BF16: tl.constexpr = False,
    TABLES: tl.constexpr = 0, SCALE_MBITS: tl.constexpr = 0, SCALE_MIN_EXP: tl.constexpr = 0,
    SCALE_MAX_CODE: tl.constexpr = 0, TWO_LEVEL_TARGET: tl.constexpr = 0.0,
    ELEM_INV: tl.constexpr = 0.0,
):  # fmt: skip
    """The largest finite |value| each direction quantizes, from one read of x (rows, cols):
    of x, or of its Hadamard transform along that direction's axis, this program's into the
    partial maxima at amax_ptr, direction 0 the rows' and 1 the columns' (0 for a direction
    not on; `store_partial`). ROUND_BF16: a float32 x read as its bfloat16 rounding. TABLES and
    the table constants: `encode_table.last_program_tables`."""
    row0, col0, x = load_program_tile(x_ptr, rows, cols, tiles_c, BR, BC)
    if ROUND_BF16:
        x = rounded_to_bf16(x)
    row_amax = 0.0
    if ROW_ON:
        row_tile = x
        if ROW_HADAMARD > 0:
            seed = seed_of(row_rht_seed_ptr, row_rht_seed_value, ROW_RHT_SEED_FROM_PTR)
            row_tile = hadamard_rows(x, seed, BR, BC, ROW_HADAMARD, ROW_LOG2_HADAMARD,
                                     ROW_HADAMARD_NORM, False, ROW_HADAMARD_SIGNS)  # fmt: skip
        row_amax = finite_amax(row_tile)
    col_amax = 0.0
    if COL_ON:
        col_tile = x
        if COL_HADAMARD > 0:
            seed = seed_of(col_rht_seed_ptr, col_rht_seed_value, COL_RHT_SEED_FROM_PTR)
            col_tile = hadamard_cols(x, seed, BR, BC, COL_HADAMARD, COL_LOG2_HADAMARD,
                                     COL_HADAMARD_NORM, COL_HADAMARD_SIGNS)  # fmt: skip
        col_amax = finite_amax(col_tile)
    store_partial(amax_ptr, 0, row_amax)
    store_partial(amax_ptr, 1, col_amax)
    last_program_tables(amax_ptr, TABLES, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX_CODE,
                        TWO_LEVEL_TARGET, ELEM_INV)  # fmt: skip


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
    HADAMARD_SIGNS: tl.constexpr,
):
    """The largest finite |x| (after the Hadamard transform, if any) of this program's tile into
    the partial maxima at amax_ptr (`store_partial`)."""
    first_line, first_pos, outer, first_inner = tile_origin(
        inner, tiles_along, ROWS, COLS, TRANSPOSED
    )
    x = transformed_tile(
        x_ptr, first_line, first_pos, outer, first_inner, lines, length, inner,
        rht_seed_ptr, rht_seed_value, ROWS, COLS, TRANSPOSED, SEED_FROM_PTR,
        HADAMARD, LOG2_HADAMARD, HADAMARD_NORM, False, HADAMARD_SIGNS,
    )  # fmt: skip
    store_partial(amax_ptr, 0, finite_amax(x))


@triton.jit
def store_partial(partials_ptr, direction, value):
    """This program's maximum of a direction into row `direction` of the (directions,
    programs) float32 partial maxima at partials_ptr, programs numbered along the grid's first
    axis, then its second and third."""
    first, second = tl.num_programs(0), tl.num_programs(1)
    programs = first * second * tl.num_programs(2)
    program = tl.program_id(0) + first * (tl.program_id(1) + second * tl.program_id(2))
    tl.store(partials_ptr + direction * programs + program, value)


@triton.jit
def finite_magnitude(values):
    """|values|, with NaN and Inf as 0."""
    magnitude = tl.abs(values)
    return tl.where(magnitude <= FLOAT32_MAX, magnitude, 0.0)


@triton.jit
def finite_amax(tile):
    """The largest finite |value| of a 2-D tile (NaN and Inf count as 0)."""
    return tl.max(tl.max(finite_magnitude(tile), axis=1), axis=0)
