"""Both block directions of a 2-D tensor from one read: the quantized Linear's operand pairs.

A linear layer quantizes each of X (tokens, in), W (out, in) and dY (tokens, out) twice: once
with blocks along its rows' length (X and W for the forward GEMM, dY for grad_input) and once
with blocks along its columns (X and dY for grad_weight, W for grad_input). A program loads one
[BR, BC] tile of the (rows, cols) input in its own layout and quantizes it with blocks along
its rows ("row direction") and with blocks down its columns ("column direction", in place: no
transpose), each with its own spec, seeds and Hadamard transform, and writes each as packed
codes and scale codes (axis-last layout) or as dequantized values (the input's layout). Under
double quantization the column direction quantizes the row direction's dequantized values,
rounded to the compute dtype, exactly what the reference reads.

Every step is the one `quantize.py` takes (`quantize_tile`, the Hadamard butterflies,
`sr_bits`) along the direction's axis, so each gives the bits of `fp4cli.quant.quantize`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.block_values import scaled_grid
from fp4cli.kernels.tiles.elements import signed_value
from fp4cli.kernels.tiles.four_over_six import (
    FOUR_OVER_SIX_ESTIMATE,
    FOUR_OVER_SIX_EXACT,
)
from fp4cli.kernels.tiles.quantize_tile import quantize_tile
from fp4cli.kernels.tiles.tile_io import (
    block_first_bits,
    block_first_bits_down,
    load_program_tile,
    load_tile,
    rounded_to_bf16,
    seed_of,
    sr_bits,
    store_codes,
    store_codes_down,
    store_column_sums,
    store_outer_amax,
    store_values,
)
from fp4cli.kernels.tiles.tile_ops import hadamard_cols, hadamard_rows


@triton.jit
def quantize_direction(
    tile, guide, row0, col0, seed_ptr, seed_value, rht_seed_ptr, rht_seed_value,
    codes_ptr, scales_ptr, values_ptr, amax_ptr, table_ptr, rows, cols, out_length,
    padded_length,
    ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK_AXIS: tl.constexpr,
    BLOCK: tl.constexpr, POW2_SCALE: tl.constexpr, CEIL: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr, SCALE_MAX: tl.constexpr,
    SCALE_NAN: tl.constexpr, SR: tl.constexpr, AWAY: tl.constexpr, GROUPED: tl.constexpr,
    SEED_FROM_PTR: tl.constexpr, RHT_SEED_FROM_PTR: tl.constexpr, PRESCALE: tl.constexpr,
    PRESCALE_INV: tl.constexpr, PRESCALE_FIX: tl.constexpr, PRESCALE_FIX_RATIO: tl.constexpr,
    PRESCALE_REMAINDER: tl.constexpr,
    HADAMARD: tl.constexpr, LOG2_HADAMARD: tl.constexpr, HADAMARD_NORM: tl.constexpr,
    HADAMARD_SIGNS: tl.constexpr, WRITE_VALUES: tl.constexpr, RETURN_VALUES: tl.constexpr,
    GUIDED: tl.constexpr,
    TENSOR_SCALE: tl.constexpr, DECODE_INV: tl.constexpr, TILE2D: tl.constexpr,
    VALUES_TENSOR_SCALE: tl.constexpr, E1M2: tl.constexpr, FOUR_OVER_SIX: tl.constexpr,
    OUTER: tl.constexpr, TWO_LEVEL_TARGET: tl.constexpr, ELEM_INV: tl.constexpr,
    EDEN: tl.constexpr,
):  # fmt: skip
    """Quantize the float32 [ROWS, COLS] tile at (row0, col0) of the (rows, cols) input with
    blocks along the tile's last axis (BLOCK_AXIS 1, out_length columns after the transform) or
    its first (BLOCK_AXIS 0, out_length rows), and store it. Returns the dequantized tile when
    RETURN_VALUES (for double quantization), else the input. GUIDED: rounded toward the
    `guide` tile (Q-EMA), transformed alike. TENSOR_SCALE: two-level, relative to the tensor
    amax at amax_ptr (of the transformed input), by its encode table at table_ptr
    (`two_level`). TILE2D: BLOCK x BLOCK square scales.
    VALUES_TENSOR_SCALE: values carry the tensor scale (else q * s, a two-level spec's block
    values). E1M2: the uniform grid's codes (`elements`). FOUR_OVER_SIX: each block keeps the
    nearer of its candidates scaled to 6 and to 4 (`four_over_six`: FOUR_OVER_SIX_ESTIMATE, the
    float32 estimate first, FOUR_OVER_SIX_EXACT, the exact errors alone, or FOUR_OVER_SIX_MAE,
    the exact absolute errors).
    HADAMARD_SIGNS: the transform's signs (`tile_ops.hadamard_signs`). OUTER (> 0, two-level):
    an amax per OUTER blocks, found in the tile (whose side along the blocks holds whole outer
    blocks) and, with packed codes, written to amax_ptr (`tile_io.store_outer_amax`). EDEN
    (> 0): MS-EDEN over groups of EDEN blocks, a block's number drawn at its first element's
    index."""
    # codes along the rows take the butterflies as sums, as `quantize_kernel`'s do (an H100:
    # the RHT-32 + SR pair to codes both ways 0.15x -> 0.18x the copy); values do not, but for
    # MS-EDEN's and outer blocks' rows, alone on thin tiles (an H200, 8192 x 3072 bf16 values:
    # 0.46 -> 0.21 ms and 0.17 -> 0.08 ms; docs/benchmarks.md)
    packed_rows: tl.constexpr = BLOCK_AXIS == 1 and not (WRITE_VALUES or RETURN_VALUES)
    sums_rows: tl.constexpr = packed_rows or (BLOCK_AXIS == 1 and (EDEN > 0 or OUTER > 0))
    if HADAMARD > 0:
        rht_seed = seed_of(rht_seed_ptr, rht_seed_value, RHT_SEED_FROM_PTR)
        if BLOCK_AXIS == 1:
            tile = hadamard_rows(tile, rht_seed, ROWS, COLS, HADAMARD, LOG2_HADAMARD,
                                 HADAMARD_NORM, sums_rows, HADAMARD_SIGNS)  # fmt: skip
            if GUIDED:
                guide = hadamard_rows(guide, rht_seed, ROWS, COLS, HADAMARD, LOG2_HADAMARD,
                                      HADAMARD_NORM, sums_rows, HADAMARD_SIGNS)  # fmt: skip
        else:
            tile = hadamard_cols(tile, rht_seed, ROWS, COLS, HADAMARD, LOG2_HADAMARD,
                                 HADAMARD_NORM, HADAMARD_SIGNS)  # fmt: skip
            if GUIDED:
                guide = hadamard_cols(guide, rht_seed, ROWS, COLS, HADAMARD, LOG2_HADAMARD,
                                      HADAMARD_NORM, HADAMARD_SIGNS)  # fmt: skip
    # element (r, c) of the transformed input draws at its row-major index there
    row_length = out_length if BLOCK_AXIS == 1 else cols
    random_bits = tile
    if SR:
        seed = seed_of(seed_ptr, seed_value, SEED_FROM_PTR)
        random_bits = sr_bits(seed, row0, col0, 0, 0, 1, row_length, ROWS, COLS, False, GROUPED,
                              SR)  # fmt: skip
    if EDEN > 0:
        seed = seed_of(seed_ptr, seed_value, SEED_FROM_PTR)
        if BLOCK_AXIS == 1:
            random_bits = block_first_bits(seed, row0, col0, 0, 0, 1, row_length, ROWS, COLS,
                                           BLOCK, False)  # fmt: skip
        else:
            random_bits = block_first_bits_down(seed, row0, col0, row_length, ROWS, COLS, BLOCK)
    tensor_amax = 0.0
    if TENSOR_SCALE and OUTER == 0:
        tensor_amax = tl.load(amax_ptr)
    # values written and no codes: grid values in place of the codes
    code, scale, scale_code, finite_blocks, tensor_amax = quantize_tile(
        tile, random_bits, guide, table_ptr, ROWS, COLS, BLOCK, POW2_SCALE, CEIL,
        SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, SCALE_NAN, SR, AWAY, PRESCALE, TENSOR_SCALE,
        GUIDED, BLOCK_AXIS, TILE2D,
        packed_rows, WRITE_VALUES, E1M2, FOUR_OVER_SIX, tensor_amax, DECODE_INV,
        OUTER, TWO_LEVEL_TARGET, ELEM_INV, EDEN, PRESCALE_INV, PRESCALE_FIX,
        PRESCALE_FIX_RATIO, PRESCALE_REMAINDER,
    )  # fmt: skip
    values = tile
    if WRITE_VALUES or RETURN_VALUES:
        signed_grid = code
        if not WRITE_VALUES:  # codes kept for the store, values for double quantization
            signed_grid = signed_value(code, E1M2)
        values = tl.reshape(
            scaled_grid(signed_grid, scale, finite_blocks, tensor_amax, PRESCALE,
                        VALUES_TENSOR_SCALE, DECODE_INV, BLOCK_AXIS, PRESCALE_INV, PRESCALE_FIX,
                        PRESCALE_FIX_RATIO, PRESCALE_REMAINDER),
            (ROWS, COLS),
        )  # fmt: skip
    row_ids = row0 + tl.arange(0, ROWS)
    col_ids = col0 + tl.arange(0, COLS)
    out_rows = rows if BLOCK_AXIS == 1 else out_length
    if WRITE_VALUES:
        store_values(values_ptr, values, row0, col0, 0, 0, row_ids < out_rows, row_length, 1,
                     ROWS, COLS, False)  # fmt: skip
    elif BLOCK_AXIS == 1:
        store_codes(codes_ptr, scales_ptr, code, scale_code, finite_blocks, row0, col0,
                    row_ids < rows, padded_length, ROWS, COLS, BLOCK)  # fmt: skip
        if OUTER > 0:
            store_outer_amax(amax_ptr, tensor_amax, row0, col0, row_ids < rows, padded_length,
                             1, ROWS, COLS, BLOCK, OUTER)  # fmt: skip
    else:
        store_codes_down(codes_ptr, scales_ptr, code, scale_code, finite_blocks, row0, col0,
                         col_ids < cols, padded_length, ROWS, COLS, BLOCK)  # fmt: skip
        if OUTER > 0:
            store_outer_amax(amax_ptr, tensor_amax, col0, row0, col_ids < cols, padded_length,
                             0, COLS, ROWS, BLOCK, OUTER)  # fmt: skip
    return values


# The constexprs of each direction, in the order of the kernel's ROW_ and COL_ parameters: what
# the call decides, the spec's (`kernels.host.spec_constants.spec_constants`), the transform's
DIRECTION_CONSTEXPRS = (
    "ON", "GROUPED", "SEED_FROM_PTR", "RHT_SEED_FROM_PTR", "WRITE_VALUES", "TILE2D",
    "VALUES_TENSOR_SCALE", "BLOCK", "CEIL", "SR", "AWAY", "EDEN", "POW2_SCALE", "SCALE_MBITS",
    "SCALE_MIN_EXP", "SCALE_MAX", "SCALE_NAN", "TENSOR_SCALE", "DECODE_INV", "OUTER",
    "TWO_LEVEL_TARGET", "ELEM_INV", "E1M2", "FOUR_OVER_SIX", "PRESCALE", "PRESCALE_INV",
    "PRESCALE_FIX", "PRESCALE_FIX_RATIO", "PRESCALE_REMAINDER", "HADAMARD", "LOG2_HADAMARD",
    "HADAMARD_NORM", "HADAMARD_SIGNS"
)  # fmt: skip


@triton.jit(
    do_not_specialize=["guide_warmup", "row_seed_value", "row_rht_seed_value",
                       "col_seed_value", "col_rht_seed_value"]
)  # fmt: skip
def quantize_pair_kernel(
    x_ptr, guide_ptr, guide_count_ptr, guide_warmup, sums_ptr,
    row_codes_ptr, row_scales_ptr, row_values_ptr,
    row_seed_ptr, row_seed_value, row_rht_seed_ptr, row_rht_seed_value, row_amax_ptr,
    row_table_ptr,
    col_codes_ptr, col_scales_ptr, col_values_ptr,
    col_seed_ptr, col_seed_value, col_rht_seed_ptr, col_rht_seed_value, col_amax_ptr,
    col_table_ptr,
    rows, cols, row_out_length, row_padded_length, col_out_length, col_padded_length, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr, DOUBLE: tl.constexpr, SOURCE_BF16: tl.constexpr,
    SOURCE_F16: tl.constexpr, ROUND_BF16: tl.constexpr, ROW_GUIDED: tl.constexpr,
    GUIDE_AVERAGE: tl.constexpr, COLUMN_SUMS: tl.constexpr, SUM_ROW_VALUES: tl.constexpr,
    # the row direction: what the call decides, then `spec_constants`, then the transform
    ROW_ON: tl.constexpr, ROW_GROUPED: tl.constexpr, ROW_SEED_FROM_PTR: tl.constexpr,
    ROW_RHT_SEED_FROM_PTR: tl.constexpr, ROW_WRITE_VALUES: tl.constexpr, ROW_TILE2D: tl.constexpr,
    ROW_VALUES_TENSOR_SCALE: tl.constexpr,
    ROW_BLOCK: tl.constexpr, ROW_CEIL: tl.constexpr, ROW_SR: tl.constexpr, ROW_AWAY: tl.constexpr,
    ROW_EDEN: tl.constexpr, ROW_POW2_SCALE: tl.constexpr, ROW_SCALE_MBITS: tl.constexpr,
    ROW_SCALE_MIN_EXP: tl.constexpr, ROW_SCALE_MAX: tl.constexpr, ROW_SCALE_NAN: tl.constexpr,
    ROW_TENSOR_SCALE: tl.constexpr, ROW_DECODE_INV: tl.constexpr, ROW_OUTER: tl.constexpr,
    ROW_TWO_LEVEL_TARGET: tl.constexpr, ROW_ELEM_INV: tl.constexpr, ROW_E1M2: tl.constexpr,
    ROW_FOUR_OVER_SIX: tl.constexpr, ROW_PRESCALE: tl.constexpr, ROW_PRESCALE_INV: tl.constexpr,
    ROW_PRESCALE_FIX: tl.constexpr, ROW_PRESCALE_FIX_RATIO: tl.constexpr,
    ROW_PRESCALE_REMAINDER: tl.constexpr,
    ROW_HADAMARD: tl.constexpr, ROW_LOG2_HADAMARD: tl.constexpr, ROW_HADAMARD_NORM: tl.constexpr,
    ROW_HADAMARD_SIGNS: tl.constexpr,
    # the column direction: what the call decides, then `spec_constants`, then the transform
    COL_ON: tl.constexpr, COL_GROUPED: tl.constexpr, COL_SEED_FROM_PTR: tl.constexpr,
    COL_RHT_SEED_FROM_PTR: tl.constexpr, COL_WRITE_VALUES: tl.constexpr, COL_TILE2D: tl.constexpr,
    COL_VALUES_TENSOR_SCALE: tl.constexpr,
    COL_BLOCK: tl.constexpr, COL_CEIL: tl.constexpr, COL_SR: tl.constexpr, COL_AWAY: tl.constexpr,
    COL_EDEN: tl.constexpr, COL_POW2_SCALE: tl.constexpr, COL_SCALE_MBITS: tl.constexpr,
    COL_SCALE_MIN_EXP: tl.constexpr, COL_SCALE_MAX: tl.constexpr, COL_SCALE_NAN: tl.constexpr,
    COL_TENSOR_SCALE: tl.constexpr, COL_DECODE_INV: tl.constexpr, COL_OUTER: tl.constexpr,
    COL_TWO_LEVEL_TARGET: tl.constexpr, COL_ELEM_INV: tl.constexpr, COL_E1M2: tl.constexpr,
    COL_FOUR_OVER_SIX: tl.constexpr, COL_PRESCALE: tl.constexpr, COL_PRESCALE_INV: tl.constexpr,
    COL_PRESCALE_FIX: tl.constexpr, COL_PRESCALE_FIX_RATIO: tl.constexpr,
    COL_PRESCALE_REMAINDER: tl.constexpr,
    COL_HADAMARD: tl.constexpr, COL_LOG2_HADAMARD: tl.constexpr, COL_HADAMARD_NORM: tl.constexpr,
    COL_HADAMARD_SIGNS: tl.constexpr,
):  # fmt: skip
    """Quantize one [BR, BC] tile of x both ways: the row direction with blocks along its rows,
    the column direction with blocks down its columns, each with its own spec.

    Arguments:
      x_ptr             x (rows, cols), float32 / bfloat16 / float16, contiguous
      guide_ptr         ROW_GUIDED: Q-EMA's guide (rows, cols), or the weight average
      guide_count_ptr, guide_warmup  GUIDE_AVERAGE: the average guides once the update count
                        at guide_count_ptr reaches guide_warmup; x as read (before ROUND_BF16)
                        guides until then
      sums_ptr          COLUMN_SUMS: float32 (cols, row tiles), each tile's column sums
      row_* / col_*     each direction's outputs, seeds, amax and encode table, as
                        `quantize_kernel`'s: codes (lines, padded / 2) and scales
                        (lines, padded / BLOCK), or values (WRITE_VALUES)
      rows, cols        x's shape
      row_out_length, row_padded_length  the rows' length after the transform, and padded
      col_out_length, col_padded_length  the columns' length after the transform, and padded
      tiles_c           tiles along the columns (`tile_io.load_program_tile`)
    Constexprs:
      BR, BC            the tile
      DOUBLE            the column direction quantizes the row direction's values
      SOURCE_BF16, SOURCE_F16  the row values rounded to the compute dtype first
      ROUND_BF16        x (float32) is quantized as x rounded to bfloat16
      ROW_GUIDED, GUIDE_AVERAGE  Q-EMA's guide for the row direction
      COLUMN_SUMS, SUM_ROW_VALUES  the bias gradient's partial sums, of x or of the row values
      ROW_*, COL_*      each direction's constexprs, `DIRECTION_CONSTEXPRS` in that order:
                        ON, what the call decides, `spec_constants`, the transform

    One program's tile, blocks of the row direction (R) along its rows and of the column
    direction (C) down its columns, both from one read:

                 col0                         col0 + BC
                   |<- ROW_BLOCK ->|               |
          row0     +---------------+--- ... -------+  ---
                   |  R scale      |               |   ^
                   +---------------+--- ... -------+   COL_BLOCK, a C scale per column
                   |               |               |   v
                   +---------------+--- ... -------+  ---
          row0 + BR

    The row direction writes (rows, row_out_length) values or (rows, row_padded_length / 2)
    codes. The column direction writes (col_out_length, cols) values or
    (cols, col_padded_length / 2) codes, its lines being x's columns."""
    # four-over-six: each direction's mode (`spec_constants`); where both take the float32
    # estimate, the columns take the exact errors alone (with the estimate's fallback both ways
    # the kernel spills)
    both_estimate: tl.constexpr = (
        ROW_FOUR_OVER_SIX == FOUR_OVER_SIX_ESTIMATE and COL_FOUR_OVER_SIX == FOUR_OVER_SIX_ESTIMATE
    )
    col_four_over_six: tl.constexpr = FOUR_OVER_SIX_EXACT if both_estimate else COL_FOUR_OVER_SIX
    row0, col0, x = load_program_tile(x_ptr, rows, cols, tiles_c, BR, BC)
    read = x
    if ROUND_BF16:
        x = rounded_to_bf16(x)
    if COLUMN_SUMS and not SUM_ROW_VALUES:
        store_column_sums(sums_ptr, x, row0, col0, cols, tiles_c, BR, BC)
    source = x
    if ROW_ON:
        guide = x
        if ROW_GUIDED:
            guide = load_tile(guide_ptr, row0, col0, 0, 0, rows, cols, 1, BR, BC, False)
            if GUIDE_AVERAGE:  # before warm-up the weight guides itself: nearest-even
                guide = tl.where(tl.load(guide_count_ptr) >= guide_warmup, guide, read)
        values = quantize_direction(
            tile=x, guide=guide, row0=row0, col0=col0, seed_ptr=row_seed_ptr,
            seed_value=row_seed_value, rht_seed_ptr=row_rht_seed_ptr,
            rht_seed_value=row_rht_seed_value, codes_ptr=row_codes_ptr, scales_ptr=row_scales_ptr,
            values_ptr=row_values_ptr, amax_ptr=row_amax_ptr, table_ptr=row_table_ptr, rows=rows,
            cols=cols, out_length=row_out_length, padded_length=row_padded_length, ROWS=BR,
            COLS=BC, BLOCK_AXIS=1, RETURN_VALUES=DOUBLE or SUM_ROW_VALUES, GUIDED=ROW_GUIDED,
            GROUPED=ROW_GROUPED, SEED_FROM_PTR=ROW_SEED_FROM_PTR,
            RHT_SEED_FROM_PTR=ROW_RHT_SEED_FROM_PTR, WRITE_VALUES=ROW_WRITE_VALUES,
            TILE2D=ROW_TILE2D, VALUES_TENSOR_SCALE=ROW_VALUES_TENSOR_SCALE, BLOCK=ROW_BLOCK,
            CEIL=ROW_CEIL, SR=ROW_SR, AWAY=ROW_AWAY, EDEN=ROW_EDEN, POW2_SCALE=ROW_POW2_SCALE,
            SCALE_MBITS=ROW_SCALE_MBITS, SCALE_MIN_EXP=ROW_SCALE_MIN_EXP, SCALE_MAX=ROW_SCALE_MAX,
            SCALE_NAN=ROW_SCALE_NAN, TENSOR_SCALE=ROW_TENSOR_SCALE, DECODE_INV=ROW_DECODE_INV,
            OUTER=ROW_OUTER, TWO_LEVEL_TARGET=ROW_TWO_LEVEL_TARGET, ELEM_INV=ROW_ELEM_INV,
            E1M2=ROW_E1M2, FOUR_OVER_SIX=ROW_FOUR_OVER_SIX, PRESCALE=ROW_PRESCALE,
            PRESCALE_INV=ROW_PRESCALE_INV, PRESCALE_FIX=ROW_PRESCALE_FIX,
            PRESCALE_FIX_RATIO=ROW_PRESCALE_FIX_RATIO, PRESCALE_REMAINDER=ROW_PRESCALE_REMAINDER,
            HADAMARD=ROW_HADAMARD, LOG2_HADAMARD=ROW_LOG2_HADAMARD,
            HADAMARD_NORM=ROW_HADAMARD_NORM, HADAMARD_SIGNS=ROW_HADAMARD_SIGNS,
        )  # fmt: skip
        # the row values in the compute dtype: what the reference re-quantizes (DOUBLE), and
        # the operand whose column sums are a quantized bias gradient (SUM_ROW_VALUES)
        if SOURCE_BF16:
            values = values.to(tl.bfloat16).to(tl.float32)
        if SOURCE_F16:
            values = values.to(tl.float16).to(tl.float32)
        if SUM_ROW_VALUES:
            store_column_sums(sums_ptr, values, row0, col0, cols, tiles_c, BR, BC)
        if DOUBLE:
            source = values
    if COL_ON:
        quantize_direction(
            tile=source, guide=source, row0=row0, col0=col0, seed_ptr=col_seed_ptr,
            seed_value=col_seed_value, rht_seed_ptr=col_rht_seed_ptr,
            rht_seed_value=col_rht_seed_value, codes_ptr=col_codes_ptr, scales_ptr=col_scales_ptr,
            values_ptr=col_values_ptr, amax_ptr=col_amax_ptr, table_ptr=col_table_ptr, rows=rows,
            cols=cols, out_length=col_out_length, padded_length=col_padded_length, ROWS=BR,
            COLS=BC, BLOCK_AXIS=0, RETURN_VALUES=False, GUIDED=False, GROUPED=COL_GROUPED,
            SEED_FROM_PTR=COL_SEED_FROM_PTR, RHT_SEED_FROM_PTR=COL_RHT_SEED_FROM_PTR,
            WRITE_VALUES=COL_WRITE_VALUES, TILE2D=COL_TILE2D,
            VALUES_TENSOR_SCALE=COL_VALUES_TENSOR_SCALE, BLOCK=COL_BLOCK, CEIL=COL_CEIL, SR=COL_SR,
            AWAY=COL_AWAY, EDEN=COL_EDEN, POW2_SCALE=COL_POW2_SCALE, SCALE_MBITS=COL_SCALE_MBITS,
            SCALE_MIN_EXP=COL_SCALE_MIN_EXP, SCALE_MAX=COL_SCALE_MAX, SCALE_NAN=COL_SCALE_NAN,
            TENSOR_SCALE=COL_TENSOR_SCALE, DECODE_INV=COL_DECODE_INV, OUTER=COL_OUTER,
            TWO_LEVEL_TARGET=COL_TWO_LEVEL_TARGET, ELEM_INV=COL_ELEM_INV, E1M2=COL_E1M2,
            FOUR_OVER_SIX=col_four_over_six, PRESCALE=COL_PRESCALE, PRESCALE_INV=COL_PRESCALE_INV,
            PRESCALE_FIX=COL_PRESCALE_FIX, PRESCALE_FIX_RATIO=COL_PRESCALE_FIX_RATIO,
            PRESCALE_REMAINDER=COL_PRESCALE_REMAINDER, HADAMARD=COL_HADAMARD,
            LOG2_HADAMARD=COL_LOG2_HADAMARD, HADAMARD_NORM=COL_HADAMARD_NORM,
            HADAMARD_SIGNS=COL_HADAMARD_SIGNS,
        )  # fmt: skip
