"""Both block directions of a 2-D tensor from one read: the quantized Linear's operand pairs.

A linear layer quantizes each of X (tokens, in), W (out, in) and dY (tokens, out) twice: once
with blocks along its rows' length (X and W for the forward GEMM, dY for grad_input) and once
with blocks along its columns (X and dY for grad_weight, W for grad_input). A program loads one
[BR, BC] tile of the (rows, cols) input in its own layout, quantizes it along the columns
("row direction": lines are rows) and along the rows ("column direction": the tile turned in
registers, lines are columns), each with its own spec, seeds and Hadamard transform, and writes
each as packed codes and scale codes (axis-last layout) or as dequantized values (the input's
layout). Under double quantization the column direction quantizes the row direction's
dequantized values, rounded to the compute dtype, exactly what the reference reads.

Every step is the one `quantize.py` takes (`quantize_tile`, `transformed` tiles, `sr_bits`), so
each direction gives the bits of `fp4cli.quant.quantize` along its axis.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.dequantize import dequantize_tile
from fp4cli.kernels.quantize import quantize_tile
from fp4cli.kernels.tile_io import load_tile, seed_of, sr_bits, store_codes, store_values
from fp4cli.kernels.tile_ops import hadamard_rows


@triton.jit
def quantize_lines(
    tile, line0, pos0, lines_ok, seed_ptr, seed_value, rht_seed_ptr, rht_seed_value,
    codes_ptr, scales_ptr, values_ptr, lines, out_length, padded_length,
    ROWS: tl.constexpr, COLS: tl.constexpr, TRANSPOSED: tl.constexpr,
    BLOCK: tl.constexpr, POW2_SCALE: tl.constexpr, CEIL: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr, SCALE_MAX: tl.constexpr,
    SCALE_NAN: tl.constexpr, SR: tl.constexpr, GROUPED: tl.constexpr,
    SEED_FROM_PTR: tl.constexpr, RHT_SEED_FROM_PTR: tl.constexpr, PRESCALE: tl.constexpr,
    HADAMARD: tl.constexpr, LOG2_HADAMARD: tl.constexpr, HADAMARD_NORM: tl.constexpr,
    WRITE_VALUES: tl.constexpr, RETURN_VALUES: tl.constexpr,
):  # fmt: skip
    """Quantize a float32 [ROWS lines, COLS positions] tile along its positions and store it.

    Not TRANSPOSED: lines are the input's rows (`lines` of them, `out_length` long). TRANSPOSED:
    lines are the input's columns and positions its rows (the input is (out_length, lines)).
    Returns the dequantized tile when RETURN_VALUES (for double quantization), else the input."""
    if HADAMARD > 0:
        rht_seed = seed_of(rht_seed_ptr, rht_seed_value, RHT_SEED_FROM_PTR)
        tile = hadamard_rows(tile, rht_seed, ROWS, COLS, HADAMARD, LOG2_HADAMARD, HADAMARD_NORM)
    random_bits = tile
    if SR:
        seed = seed_of(seed_ptr, seed_value, SEED_FROM_PTR)
        if TRANSPOSED:
            random_bits = sr_bits(seed, line0, pos0, 0, line0, lines, out_length,
                                  ROWS, COLS, True, GROUPED)  # fmt: skip
        else:
            random_bits = sr_bits(seed, line0, pos0, 0, 0, lines, out_length,
                                  ROWS, COLS, False, GROUPED)  # fmt: skip
    code, scale, scale_code, finite_blocks = quantize_tile(
        tile, random_bits, 1.0, ROWS, COLS, BLOCK, POW2_SCALE, CEIL, SCALE_MBITS, SCALE_MIN_EXP,
        SCALE_MAX, SCALE_NAN, SR, PRESCALE, False,
    )  # fmt: skip
    values = tile
    if WRITE_VALUES or RETURN_VALUES:
        values = tl.reshape(
            dequantize_tile(code, scale, finite_blocks, 1.0, PRESCALE, False), (ROWS, COLS)
        )
    if WRITE_VALUES:
        if TRANSPOSED:
            store_values(values_ptr, values, line0, pos0, 0, line0, lines_ok, out_length, lines,
                         ROWS, COLS, True)  # fmt: skip
        else:
            store_values(values_ptr, values, line0, pos0, 0, 0, lines_ok, out_length, 1,
                         ROWS, COLS, False)  # fmt: skip
    else:
        store_codes(codes_ptr, scales_ptr, code, scale_code, finite_blocks, line0, pos0,
                    lines_ok, padded_length, ROWS, COLS, BLOCK)  # fmt: skip
    return values


@triton.jit(
    do_not_specialize=["row_seed_value", "row_rht_seed_value", "col_seed_value",
                       "col_rht_seed_value"]
)  # fmt: skip
def quantize_pair_kernel(
    x_ptr,
    row_codes_ptr, row_scales_ptr, row_values_ptr,
    row_seed_ptr, row_seed_value, row_rht_seed_ptr, row_rht_seed_value,
    col_codes_ptr, col_scales_ptr, col_values_ptr,
    col_seed_ptr, col_seed_value, col_rht_seed_ptr, col_rht_seed_value,
    rows, cols, row_out_length, row_padded_length, col_out_length, col_padded_length, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr, DOUBLE: tl.constexpr, SOURCE_BF16: tl.constexpr,
    SOURCE_F16: tl.constexpr,
    ROW_ON: tl.constexpr, ROW_BLOCK: tl.constexpr, ROW_POW2_SCALE: tl.constexpr,
    ROW_CEIL: tl.constexpr, ROW_SCALE_MBITS: tl.constexpr, ROW_SCALE_MIN_EXP: tl.constexpr,
    ROW_SCALE_MAX: tl.constexpr, ROW_SCALE_NAN: tl.constexpr, ROW_SR: tl.constexpr,
    ROW_GROUPED: tl.constexpr, ROW_SEED_FROM_PTR: tl.constexpr,
    ROW_RHT_SEED_FROM_PTR: tl.constexpr, ROW_PRESCALE: tl.constexpr, ROW_HADAMARD: tl.constexpr,
    ROW_LOG2_HADAMARD: tl.constexpr, ROW_HADAMARD_NORM: tl.constexpr,
    ROW_WRITE_VALUES: tl.constexpr,
    COL_ON: tl.constexpr, COL_BLOCK: tl.constexpr, COL_POW2_SCALE: tl.constexpr,
    COL_CEIL: tl.constexpr, COL_SCALE_MBITS: tl.constexpr, COL_SCALE_MIN_EXP: tl.constexpr,
    COL_SCALE_MAX: tl.constexpr, COL_SCALE_NAN: tl.constexpr, COL_SR: tl.constexpr,
    COL_GROUPED: tl.constexpr, COL_SEED_FROM_PTR: tl.constexpr,
    COL_RHT_SEED_FROM_PTR: tl.constexpr, COL_PRESCALE: tl.constexpr, COL_HADAMARD: tl.constexpr,
    COL_LOG2_HADAMARD: tl.constexpr, COL_HADAMARD_NORM: tl.constexpr,
    COL_WRITE_VALUES: tl.constexpr,
):  # fmt: skip
    """x (rows, cols) contiguous. Row direction: output (rows, row_out_length) values or
    (rows, row_padded_length / 2) codes; column direction: (col_out_length, cols) values or
    (cols, col_padded_length / 2) codes."""
    pid = tl.program_id(0)
    row0 = ((pid // tiles_c) * BR).to(tl.int64)
    col0 = ((pid % tiles_c) * BC).to(tl.int64)
    x = load_tile(x_ptr, row0, col0, 0, 0, rows, cols, 1, BR, BC, False)
    source = x
    if ROW_ON:
        rows_ok = (row0 + tl.arange(0, BR)) < rows
        values = quantize_lines(
            x, row0, col0, rows_ok, row_seed_ptr, row_seed_value, row_rht_seed_ptr,
            row_rht_seed_value, row_codes_ptr, row_scales_ptr, row_values_ptr, rows,
            row_out_length, row_padded_length, BR, BC, False, ROW_BLOCK, ROW_POW2_SCALE,
            ROW_CEIL, ROW_SCALE_MBITS, ROW_SCALE_MIN_EXP, ROW_SCALE_MAX, ROW_SCALE_NAN, ROW_SR,
            ROW_GROUPED, ROW_SEED_FROM_PTR, ROW_RHT_SEED_FROM_PTR, ROW_PRESCALE, ROW_HADAMARD,
            ROW_LOG2_HADAMARD, ROW_HADAMARD_NORM, ROW_WRITE_VALUES, DOUBLE,
        )  # fmt: skip
        if DOUBLE:  # the reference re-quantizes the forward operand in the compute dtype
            if SOURCE_BF16:
                values = values.to(tl.bfloat16).to(tl.float32)
            if SOURCE_F16:
                values = values.to(tl.float16).to(tl.float32)
            source = values
    if COL_ON:
        cols_ok = (col0 + tl.arange(0, BC)) < cols
        quantize_lines(
            tl.trans(source), col0, row0, cols_ok, col_seed_ptr, col_seed_value,
            col_rht_seed_ptr, col_rht_seed_value, col_codes_ptr, col_scales_ptr, col_values_ptr,
            cols, col_out_length, col_padded_length, BC, BR, True, COL_BLOCK, COL_POW2_SCALE,
            COL_CEIL, COL_SCALE_MBITS, COL_SCALE_MIN_EXP, COL_SCALE_MAX, COL_SCALE_NAN, COL_SR,
            COL_GROUPED, COL_SEED_FROM_PTR, COL_RHT_SEED_FROM_PTR, COL_PRESCALE, COL_HADAMARD,
            COL_LOG2_HADAMARD, COL_HADAMARD_NORM, COL_WRITE_VALUES, False,
        )  # fmt: skip
