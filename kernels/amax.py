"""The tensor amax a two-level (NVFP4-style) spec scales by, from one read of a 2-D tensor.

`amax_pair_kernel` loads [BR, BC] tiles and reduces each direction's largest finite |value|:
of the tile, or of its Hadamard transform along that direction's axis (`hadamard_rows`,
`hadamard_cols`), any pair of directions. Its transforms move values between threads at their
wider butterfly stages; the commonest transformed pairs take the slab kernels of
`amax_slabs.py`, which move nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.quantize import finite_amax
from fp4cli.kernels.tile_io import load_program_tile, seed_of
from fp4cli.kernels.tile_ops import hadamard_cols, hadamard_rows


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
    COL_HADAMARD_SIGNS: tl.constexpr,
):  # fmt: skip
    """The largest finite |value| each direction quantizes, from one read of x (rows, cols):
    of x, or of its Hadamard transform along that direction's axis, into amax_ptr[0] (row
    direction) and amax_ptr[1] (column direction)."""
    row0, col0, x = load_program_tile(x_ptr, rows, cols, tiles_c, BR, BC)
    if ROW_ON:
        row_tile = x
        if ROW_HADAMARD > 0:
            seed = seed_of(row_rht_seed_ptr, row_rht_seed_value, ROW_RHT_SEED_FROM_PTR)
            row_tile = hadamard_rows(x, seed, BR, BC, ROW_HADAMARD, ROW_LOG2_HADAMARD,
                                     ROW_HADAMARD_NORM, False, ROW_HADAMARD_SIGNS)  # fmt: skip
        tl.atomic_max(amax_ptr, finite_amax(row_tile))
    if COL_ON:
        col_tile = x
        if COL_HADAMARD > 0:
            seed = seed_of(col_rht_seed_ptr, col_rht_seed_value, COL_RHT_SEED_FROM_PTR)
            col_tile = hadamard_cols(x, seed, BR, BC, COL_HADAMARD, COL_LOG2_HADAMARD,
                                     COL_HADAMARD_NORM, COL_HADAMARD_SIGNS)  # fmt: skip
        tl.atomic_max(amax_ptr + 1, finite_amax(col_tile))
