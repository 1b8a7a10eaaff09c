"""Vector-wise quantization of 2-D tensors: one power-of-two (E8M0) scale per row, per column or
per tensor, elements E2M1, E4M3 or E5M2 rounded to nearest even (`fp4cli.quant.reference` with
block "row", "column" or "tensor"), and Wang et al.'s per-row outlier clamp fused into the
per-row pass.

- `rows_kernel`: a program per block of rows. It finds each row's clamp thresholds (exact order
  statistics without a sort, `order_stats.row_thresholds`), clamps and quantizes with the
  row's amax, holding the row in registers when it fits one chunk (the clamped row's amax
  then comes from its thresholds) and looping over column chunks otherwise (reduced from the
  clamped chunks; the repeated reads then come from the cache).
- `amax_kernel` + `scaled_kernel`: per-column or per-tensor scales, whose amax spans programs:
  the first reduces the finite amax (and whether anything is NaN or Inf) into an int32 buffer
  with atomics, the second quantizes elementwise with the scales derived from it.
- `decode_kernel`: values from the codes and scales the first two write.

Amaxes are kept as the bits of |x|: for non-negative floats the integer order is the float order,
and NaN and Inf have the largest bits, so one integer max gives both the amax and whether the
line is finite. Elements are rounded by `round_unsigned_minifloat` (bit arithmetic, saturating);
values are written signed as the reference's (the sign of a value rounded to zero kept), codes as
sign << (bits - 1) | magnitude code, one per byte (the FP8 formats' own bit patterns).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_io import block_at, rounded_to_bf16, store_column_sums
from fp4cli.kernels.tiles.tile_ops import (
    e8m0_exponent,
    pow2,
    round_unsigned_minifloat,
    signed,
    ties_toward_positive,
    unsigned_minifloat_value,
)
from fp4cli.kernels.vector.order_stats import (
    INT32_MAX,
    abs_bits,
    order_key,
    read_row_thresholds,
    row_thresholds,
)
from fp4cli.quant.scales import BF16_LOG_ROUNDS_UP_FROM, BF16_SCALE_RANGE

NON_FINITE_BITS = tl.constexpr(0x7F800000)
BF16_SCALE_LOW = tl.constexpr(BF16_SCALE_RANGE[0])
BF16_SCALE_HIGH = tl.constexpr(BF16_SCALE_RANGE[1])
# `scales.BF16_LOG_ROUNDS_UP_FROM` by half spacing 2^-n (2^-8 and 2^-9: 128, never)
UP_FROM_1 = tl.constexpr(BF16_LOG_ROUNDS_UP_FROM[-1])
UP_FROM_2 = tl.constexpr(BF16_LOG_ROUNDS_UP_FROM[-2])
UP_FROM_3 = tl.constexpr(BF16_LOG_ROUNDS_UP_FROM[-3])
UP_FROM_4 = tl.constexpr(BF16_LOG_ROUNDS_UP_FROM[-4])
UP_FROM_5 = tl.constexpr(BF16_LOG_ROUNDS_UP_FROM[-5])
UP_FROM_6 = tl.constexpr(BF16_LOG_ROUNDS_UP_FROM[-6])
UP_FROM_7 = tl.constexpr(BF16_LOG_ROUNDS_UP_FROM[-7])
BY_ROW = tl.constexpr(0)
BY_COLUMN = tl.constexpr(1)
BY_TENSOR = tl.constexpr(2)


@triton.jit
def program_tile(R, C, tiles_c, BR: tl.constexpr, BC: tl.constexpr):
    """(first_row, first_col, offsets, mask) of this program's [BR, BC] tile of a contiguous
    (R, C) tensor, tiles numbered row of tiles by row of tiles, tiles_c to a row."""
    pid = tl.program_id(0)
    first_row, first_col = (pid // tiles_c) * BR, (pid % tiles_c) * BC
    offsets, mask = block_at(first_row, first_col, R, C, BR, BC)
    return first_row, first_col, offsets, mask


@triton.jit
def clamp_rows(x, low, high):
    """x clamped to [low, high] per row (NaN stays NaN)."""
    return tl.where(x < low[:, None], low[:, None], tl.where(x > high[:, None], high[:, None], x))


@triton.jit
def magnitude_bits(x, mask):
    """The bits of |x| as int32 (0 outside the mask)."""
    return tl.where(mask, abs_bits(x), 0)


@triton.jit
def scale_exponent(amax_bits, ELEM_MAX_EXP: tl.constexpr, ELEM_MAX_MANT: tl.constexpr,
                   CEIL: tl.constexpr, SCALE_BF16: tl.constexpr):  # fmt: skip
    """(E8M0 exponent, finite) of lines whose |x| bits reduce to amax_bits; SCALE_BF16:
    MS-AMP's bfloat16 arithmetic where the amax lies in its range (`bf16_exponent`)."""
    finite = amax_bits < NON_FINITE_BITS
    amax = tl.where(finite, amax_bits, 0).to(tl.float32, bitcast=True)
    exponent = e8m0_exponent(amax, ELEM_MAX_EXP, ELEM_MAX_MANT, CEIL)
    if SCALE_BF16:
        in_range = (amax >= BF16_SCALE_LOW) & (amax <= BF16_SCALE_HIGH)
        exponent = tl.where(in_range, bf16_exponent(tl.where(in_range, amax, 1.0)), exponent)
    return exponent, finite


@triton.jit
def bf16_exponent(amax):
    """`fp4cli.quant.scales.bf16_scale_exponent` of amaxes within BF16_SCALE_RANGE (int32):
    r = bf16(bf16(1 / bf16(amax)) * 6) = 2^k (1 + m / 128), then -(k + 1) where log2 r rounds
    up to k + 1 in bfloat16 (m at least the table's entry for the half spacing there), else
    -k. Integer steps and one correctly rounded division."""
    a = rounded_to_bf16(amax)
    r = rounded_to_bf16(rounded_to_bf16(tl.div_rn(tl.full(a.shape, 1.0, tl.float32), a)) * 6.0)
    bits = r.to(tl.int32, bitcast=True)
    k = ((bits >> 23) & 0xFF) - 127
    mantissa = (bits >> 16) & 0x7F
    return -(k + (mantissa >= rounds_up_from(k + 1)).to(tl.int32))


@triton.jit
def rounds_up_from(target):
    """`scales._rounds_up_from` of integers |target| < 2^8 (int32): the table entry for the
    half spacing 2^h, h = floor(log2 |target|) - 8 (one less just below a positive power of
    two), 128 (never) for 0."""
    magnitude = tl.maximum(tl.abs(target), 1)
    j = ((magnitude.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # exact
    below_power = (target > 0) & ((magnitude & (magnitude - 1)) == 0)
    h = j - 8 - below_power.to(tl.int32)
    least = tl.full(h.shape, 128, tl.int32)  # h <= -8: never
    least = tl.where(h == -7, UP_FROM_7, least)
    least = tl.where(h == -6, UP_FROM_6, least)
    least = tl.where(h == -5, UP_FROM_5, least)
    least = tl.where(h == -4, UP_FROM_4, least)
    least = tl.where(h == -3, UP_FROM_3, least)
    least = tl.where(h == -2, UP_FROM_2, least)
    least = tl.where(h == -1, UP_FROM_1, least)
    return tl.where(target == 0, 128, least)


@triton.jit
def quantized_values(x, exponent, finite, MBITS: tl.constexpr, MIN_EXP: tl.constexpr,
                     ELEM_MAX: tl.constexpr, TIES_UP: tl.constexpr):  # fmt: skip
    """(float32 values q * 2^exponent signed as x, NaN where not finite; magnitude codes;
    whether x is negative) of a tile, `exponent` and `finite` broadcast to its shape; to
    nearest, ties to even (TIES_UP: toward +inf)."""
    magnitude = tl.abs(x) * pow2(-exponent)  # exact: a power of two
    rounded, code = round_unsigned_minifloat(magnitude, MBITS, MIN_EXP, ELEM_MAX, False, True)
    negative = x.to(tl.int32, bitcast=True) < 0
    if TIES_UP:
        rounded, code = ties_toward_positive(
            tl.minimum(magnitude, ELEM_MAX), rounded, code, negative, MBITS, MIN_EXP
        )
    value = rounded * pow2(exponent)
    value = signed(value, negative)
    return tl.where(finite, value, float("nan")), code, negative


@triton.jit
def store_quantized(out_ptr, offsets, mask, value, code, negative, SIGN_BIT: tl.constexpr,
                    WRITE_CODES: tl.constexpr):  # fmt: skip
    """Values in the output's dtype, or codes (sign bit | magnitude code) as uint8; returns
    the bits of |value as written| (for a following per-tensor amax)."""
    if WRITE_CODES:
        signed_code = code | tl.where(negative, SIGN_BIT, 0)
        tl.store(out_ptr + offsets, signed_code.to(tl.uint8), mask=mask)
        written = value
    else:
        written = value.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offsets, written, mask=mask)
    return magnitude_bits(written.to(tl.float32), mask)


@triton.jit
def _finish_rows(x_ptr, out_ptr, offsets, mask, x, low, high, exponent, finite,
                 CLAMP: tl.constexpr, RESIDUAL: tl.constexpr, MBITS: tl.constexpr,
                 MIN_EXP: tl.constexpr, ELEM_MAX: tl.constexpr, SIGN_BIT: tl.constexpr,
                 WRITE_CODES: tl.constexpr, TIES_UP: tl.constexpr):  # fmt: skip
    """Quantize and store one [BR, BC] chunk of rows; returns the written |values|' max bits."""
    clamped = x
    if CLAMP:
        clamped = clamp_rows(x, low, high)
    value, code, negative = quantized_values(
        clamped, exponent[:, None], finite[:, None], MBITS, MIN_EXP, ELEM_MAX, TIES_UP
    )
    if RESIDUAL:  # compensation: (value in x's dtype) + (x - clamped in x's dtype), rounded once
        dtype = x_ptr.dtype.element_ty
        residual = (x - clamped).to(dtype).to(tl.float32)
        value = value.to(dtype).to(tl.float32) + residual
    written = store_quantized(out_ptr, offsets, mask, value, code, negative, SIGN_BIT, WRITE_CODES)
    return tl.max(written, axis=1)


@triton.jit
def rows_kernel(
    x_ptr, out_ptr, scales_ptr, amax_out_ptr,
    R, C, low_rank, high_rank,
    BR: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr, TAIL: tl.constexpr,
    CLAMP: tl.constexpr, GROUP: tl.constexpr, TAIL_GROUP: tl.constexpr,
    SPLIT_LOW: tl.constexpr, SPLIT_HIGH: tl.constexpr, ZERO_BITS: tl.constexpr,
    RESIDUAL: tl.constexpr, WRITE_CODES: tl.constexpr,
    WRITE_SCALES: tl.constexpr, AMAX_OUT: tl.constexpr,
    MBITS: tl.constexpr, MIN_EXP: tl.constexpr, ELEM_MAX: tl.constexpr,
    ELEM_MAX_EXP: tl.constexpr, ELEM_MAX_MANT: tl.constexpr, CEIL: tl.constexpr,
    SCALE_BF16: tl.constexpr, SIGN_BIT: tl.constexpr, TIES_UP: tl.constexpr,
):  # fmt: skip
    """One scale per row of a contiguous (R, C) tensor, rows clamped to their values of ranks
    low_rank and high_rank first when CLAMP (with RESIDUAL, the clamped-off part added back to
    the written values; GROUP, TAIL_GROUP: the columns of a pair of the search's candidates,
    SPLIT_LOW, SPLIT_HIGH: its bounds, `order_stats.row_thresholds`).
    Writes values (or codes), the scales as float32 (NaN for a non-finite
    row) when WRITE_SCALES, and atomically maxes the written |values|' bits into amax_out_ptr
    when AMAX_OUT."""
    first_row = tl.program_id(0) * BR
    rows_ok = (first_row + tl.arange(0, BR)) < R
    low = tl.zeros([BR], tl.float32)
    high = low
    if ONE_CHUNK:  # the row in registers: BC columns, then TAIL more (when TAIL > 0)
        offsets, mask = block_at(first_row, 0, R, C, BR, BC)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tail_x, tail_mask = x, mask  # no tail: unused
        if TAIL > 0:
            tail_offsets, tail_mask = block_at(first_row, BC, R, C, BR, TAIL)
            tail_x = tl.load(x_ptr + tail_offsets, mask=tail_mask, other=0.0).to(tl.float32)
        if CLAMP:  # the clamped row's amax from its thresholds
            keys = tl.where(mask, order_key(x), INT32_MAX)
            tail_keys = tl.where(tail_mask, order_key(tail_x), INT32_MAX)
            low, high, amax_bits, _ = row_thresholds(
                keys, mask, tail_keys, tail_mask, x_ptr, first_row, R, C, low_rank, high_rank,
                BR, BC, TAIL, GROUP, TAIL_GROUP, SPLIT_LOW, SPLIT_HIGH, ZERO_BITS,
            )  # fmt: skip
        else:
            amax_bits = tl.max(magnitude_bits(x, mask), axis=1)
            if TAIL > 0:
                amax_bits = tl.maximum(amax_bits, tl.max(magnitude_bits(tail_x, tail_mask), axis=1))
        exponent, finite = scale_exponent(amax_bits, ELEM_MAX_EXP, ELEM_MAX_MANT, CEIL, SCALE_BF16)
        written = _finish_rows(
            x_ptr, out_ptr, offsets, mask, x, low, high, exponent, finite, CLAMP, RESIDUAL,
            MBITS, MIN_EXP, ELEM_MAX, SIGN_BIT, WRITE_CODES, TIES_UP,
        )  # fmt: skip
        if TAIL > 0:
            tail_written = _finish_rows(
                x_ptr, out_ptr, tail_offsets, tail_mask, tail_x, low, high, exponent, finite,
                CLAMP, RESIDUAL, MBITS, MIN_EXP, ELEM_MAX, SIGN_BIT, WRITE_CODES, TIES_UP,
            )  # fmt: skip
            written = tl.maximum(written, tail_written)
    else:
        if CLAMP:
            low, high = read_row_thresholds(
                x_ptr, first_row, R, C, low_rank, high_rank, BR, BC, ZERO_BITS
            )
        amax_bits = tl.zeros([BR], tl.int32)
        for start in range(0, C, BC):
            offsets, mask = block_at(first_row, start, R, C, BR, BC)
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            if CLAMP:
                x = clamp_rows(x, low, high)
            amax_bits = tl.maximum(amax_bits, tl.max(magnitude_bits(x, mask), axis=1))
        exponent, finite = scale_exponent(amax_bits, ELEM_MAX_EXP, ELEM_MAX_MANT, CEIL, SCALE_BF16)
        written = tl.zeros([BR], tl.int32)
        for start in range(0, C, BC):
            offsets, mask = block_at(first_row, start, R, C, BR, BC)
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            chunk_max = _finish_rows(
                x_ptr, out_ptr, offsets, mask, x, low, high, exponent, finite, CLAMP, RESIDUAL,
                MBITS, MIN_EXP, ELEM_MAX, SIGN_BIT, WRITE_CODES, TIES_UP,
            )  # fmt: skip
            written = tl.maximum(written, chunk_max)
    if WRITE_SCALES:
        scale = tl.where(finite, pow2(exponent), float("nan"))
        tl.store(scales_ptr + first_row + tl.arange(0, BR), scale, mask=rows_ok)
    if AMAX_OUT:
        tl.atomic_max(amax_out_ptr, tl.max(written, axis=0))


@triton.jit
def line_index(first_row, first_col, BR: tl.constexpr, BC: tl.constexpr, BY: tl.constexpr):
    """The scale index of each row (BY_ROW), column (BY_COLUMN) or of the tensor (0)."""
    if BY == BY_ROW:
        index = first_row + tl.arange(0, BR)
    elif BY == BY_COLUMN:
        index = first_col + tl.arange(0, BC)
    else:
        index = tl.zeros([1], tl.int32)
    return index


@triton.jit
def line_ok(index, R, C, BY: tl.constexpr):
    """Which scale indices exist."""
    if BY == BY_ROW:
        ok = index < R
    elif BY == BY_COLUMN:
        ok = index < C
    else:
        ok = index < 1
    return ok


@triton.jit
def expand_line(line_values, BY: tl.constexpr):
    """Per-line values broadcastable against a [BR, BC] tile."""
    if BY == BY_ROW:  # noqa: SIM108 (a constexpr branch, resolved when compiling)
        out = line_values[:, None]
    else:
        out = line_values[None, :]
    return out


@triton.jit
def amax_kernel(
    x_ptr, amax_ptr, sums_ptr, R, C, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr, G: tl.constexpr, BY: tl.constexpr,
    COLUMN_SUMS: tl.constexpr,
):  # fmt: skip
    """Atomically max the |x| bits of each column (BY_COLUMN) or of the whole tensor
    (BY_TENSOR) of a contiguous (R, C) tensor into the int32 buffer at amax_ptr (zeroed).
    A program reads G tiles of [BR, BC] down one strip of columns (programs numbered group of
    G row tiles by group, tiles_c to a group) and reduces once. COLUMN_SUMS: also each
    group's float32 column sums (element by element over its tiles, then over its BR rows),
    into column (group) of the (C, groups) sums (a linear layer's bias gradient from dY's
    read)."""
    pid = tl.program_id(0)
    group, first_col = pid // tiles_c, (pid % tiles_c) * BC
    sums = tl.zeros([BR, BC], tl.float32)
    top = tl.zeros([BR, BC], tl.int32)
    for g in tl.static_range(G):
        offsets, mask = block_at((group * G + g) * BR, first_col, R, C, BR, BC)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if COLUMN_SUMS:
            sums += x
        top = tl.maximum(top, magnitude_bits(x, mask))
    if COLUMN_SUMS:
        store_column_sums(sums_ptr, sums, group * BR, first_col, C, tiles_c, BR, BC)
    if BY == BY_COLUMN:
        cols = first_col + tl.arange(0, BC)
        tl.atomic_max(amax_ptr + cols, tl.max(top, axis=0), mask=cols < C)
    else:
        tl.atomic_max(amax_ptr, tl.max(tl.max(top, axis=1), axis=0))


@triton.jit
def scaled_kernel(
    x_ptr, amax_ptr, out_ptr, out_t_ptr, scales_ptr, amax_out_ptr,
    R, C, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr, BY: tl.constexpr,
    ROWS_OUT: tl.constexpr, CODES_T: tl.constexpr,
    WRITE_CODES: tl.constexpr, WRITE_SCALES: tl.constexpr, AMAX_OUT: tl.constexpr,
    MBITS: tl.constexpr, MIN_EXP: tl.constexpr, ELEM_MAX: tl.constexpr,
    ELEM_MAX_EXP: tl.constexpr, ELEM_MAX_MANT: tl.constexpr, CEIL: tl.constexpr,
    SCALE_BF16: tl.constexpr, SIGN_BIT: tl.constexpr, TIES_UP: tl.constexpr,
):  # fmt: skip
    """Quantize a tile of a contiguous (R, C) tensor with the scales of the amax bits
    `amax_kernel` reduced (per column or per tensor): values or codes in x's layout when
    ROWS_OUT, codes of the transpose (a contiguous (C, R)) when CODES_T. The programs of the
    first row of tiles write the scales (float32, NaN where not finite) when WRITE_SCALES;
    AMAX_OUT as in `rows_kernel`."""
    first_row, first_col, offsets, mask = program_tile(R, C, tiles_c, BR, BC)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    index = line_index(first_row, first_col, BR, BC, BY)
    index_ok = line_ok(index, R, C, BY)
    amax_bits = tl.load(amax_ptr + index, mask=index_ok, other=0)
    exponent, finite = scale_exponent(amax_bits, ELEM_MAX_EXP, ELEM_MAX_MANT, CEIL, SCALE_BF16)
    value, code, negative = quantized_values(
        x, expand_line(exponent, BY), expand_line(finite, BY), MBITS, MIN_EXP, ELEM_MAX,
        TIES_UP,
    )  # fmt: skip
    if ROWS_OUT:
        written = store_quantized(
            out_ptr, offsets, mask, value, code, negative, SIGN_BIT, WRITE_CODES
        )
    else:
        written = magnitude_bits(value, mask)
    if CODES_T:
        rows = first_row + tl.arange(0, BR)
        cols = first_col + tl.arange(0, BC)
        t_offsets = cols.to(tl.int64)[None, :] * R + rows[:, None]
        signed_code = code | tl.where(negative, SIGN_BIT, 0)
        tl.store(out_t_ptr + t_offsets, signed_code.to(tl.uint8), mask=mask)
    if WRITE_SCALES:
        if BY == BY_ROW:  # noqa: SIM108 (a constexpr branch)
            first_of_line = first_col == 0
        else:
            first_of_line = first_row == 0
        if first_of_line:
            scale = tl.where(finite, pow2(exponent), float("nan"))
            tl.store(scales_ptr + index, scale, mask=index_ok)
    if AMAX_OUT:
        tl.atomic_max(amax_out_ptr, tl.max(tl.max(written, axis=1), axis=0))


@triton.jit
def decode_kernel(
    codes_ptr, scales_ptr, out_ptr, R, C, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr, BY: tl.constexpr,
    MBITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_CODE: tl.constexpr,
    SIGN_BIT: tl.constexpr,
):  # fmt: skip
    """Values (out's dtype) of the codes and float32 scales (per row, column or tensor) that
    `rows_kernel` or `scaled_kernel` wrote: magnitude * scale, signed."""
    first_row, first_col, offsets, mask = program_tile(R, C, tiles_c, BR, BC)
    code = tl.load(codes_ptr + offsets, mask=mask, other=0).to(tl.int32)
    index = line_index(first_row, first_col, BR, BC, BY)
    index_ok = line_ok(index, R, C, BY)
    scale = tl.load(scales_ptr + index, mask=index_ok, other=1.0)
    magnitude = unsigned_minifloat_value(code & (SIGN_BIT - 1), MBITS, MIN_EXP, MAX_CODE)
    value = magnitude * expand_line(scale, BY)
    value = signed(value.to(tl.float32), (code & SIGN_BIT) != 0)
    tl.store(out_ptr + offsets, value.to(out_ptr.dtype.element_ty), mask=mask)
