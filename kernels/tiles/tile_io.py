"""Where a quantization kernel's tile lies, and its loads and stores.

A program works on a tile of ROWS lines x COLS positions along the quantization axis. Lines are
the rows of the axis-last layout: for an input whose axis is last, its rows; otherwise the input
is viewed as (outer, length, inner), a line is one (outer, inner) pair, and the tile is loaded
along inner, where memory is contiguous, and turned in registers (no transposed copy is made).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.philox import philox_words
from fp4cli.kernels.tiles.tile_ops import hadamard_rows, random_bits_at, random_bits_rows

GRID_Y = tl.constexpr(65535)  # the most programs a launch grid has along its second axis


@triton.jit
def tile_origin(
    inner, tiles_along, ROWS: tl.constexpr, COLS: tl.constexpr, TRANSPOSED: tl.constexpr
):
    """(first line, first position along the axis, outer index, first inner index) of this
    program's tile. Lines are the rows of the axis-last layout: not transposed, the input's
    rows, the grid (line tiles, tiles along the axis, tiles along / GRID_Y rounded up), so no
    program divides; transposed (input viewed as (outer, length, inner)), a grid of one axis,
    line = outer * inner + inner index, and one tile's lines share one outer index."""
    if TRANSPOSED:
        pid = tl.program_id(0)
        tiles_inner = tl.cdiv(inner, ROWS)
        outer = (pid // (tiles_along * tiles_inner)).to(tl.int64)
        rest = pid % (tiles_along * tiles_inner)
        first_inner = (rest % tiles_inner) * ROWS
        return outer * inner + first_inner, (rest // tiles_inner) * COLS, outer, first_inner
    first_line = tl.program_id(0).to(tl.int64) * ROWS
    along = tl.program_id(1) + tl.program_id(2) * GRID_Y
    return first_line, along * COLS, first_line * 0, 0


@triton.jit
def line_mask(first_line, first_inner, lines, inner, ROWS: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Which of the tile's ROWS lines exist."""
    if TRANSPOSED:
        return (first_inner + tl.arange(0, ROWS)) < inner
    return (first_line + tl.arange(0, ROWS)) < lines


@triton.jit
def block_at(first_row, first_col, R, C, BR: tl.constexpr, BC: tl.constexpr):
    """(offsets, mask) of the [BR, BC] block at (first_row, first_col) of a contiguous (R, C)."""
    rows = first_row + tl.arange(0, BR)
    cols = first_col + tl.arange(0, BC)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    return rows.to(tl.int64)[:, None] * C + cols[None, :], mask


@triton.jit
def runs_by_thread(x_ptr, first_line, first_pos, lines, length, ROWS: tl.constexpr,
                   COLS: tl.constexpr, RUN: tl.constexpr):  # fmt: skip
    """`load_tile` along the last axis, laid out so that one thread holds each run of RUN (8,
    16 or 32) consecutive positions: each run's parts of 8 positions loaded as one [runs, 8]
    tensor apiece, then joined in registers. A transform or reduction over a run then stays in
    its thread: no shuffles, no shared memory (Triton lays out a [runs, 8] load with a run a
    thread, and a join adds its axis in registers)."""
    RUNS_ALONG: tl.constexpr = COLS // RUN
    run = tl.arange(0, ROWS * RUNS_ALONG)
    line = (first_line + run // RUNS_ALONG)[:, None]
    start = (first_pos + (run % RUNS_ALONG) * RUN)[:, None] + tl.arange(0, 8)[None, :]
    runs = _run_part(x_ptr, line, start, lines, length)
    if RUN >= 16:  # [runs, 8, 2 parts] -> [runs, 2, 8]
        runs = tl.join(runs, _run_part(x_ptr, line, start + 8, lines, length))
        if RUN == 16:
            runs = tl.permute(runs, (0, 2, 1))
        else:  # [runs, 8, 2 (part mod 2), 2 (part // 2)] -> [runs, 2, 2, 8]
            second = tl.join(
                _run_part(x_ptr, line, start + 16, lines, length),
                _run_part(x_ptr, line, start + 24, lines, length),
            )
            runs = tl.permute(tl.join(runs, second), (0, 3, 2, 1))
    return tl.reshape(runs, (ROWS, COLS))


@triton.jit
def _run_part(x_ptr, line, pos, lines, length):
    """float32 x at [line, pos] of a contiguous (lines, length) x, zero outside it."""
    mask = (line < lines) & (pos < length)
    return tl.load(x_ptr + line * length + pos, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def load_tile(
    x_ptr,
    first_line,
    first_pos,
    outer,
    first_inner,
    lines,
    length,
    inner,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    RUN: tl.constexpr = 0,
):
    """The float32 tile [ROWS lines, COLS positions] at the origin, zero outside the input
    ((lines, length) contiguous, or (outer, length, inner) contiguous when TRANSPOSED).
    RUN > 0 (not TRANSPOSED): loaded so that each thread holds runs of RUN consecutive
    positions (`runs_by_thread`); the same values."""
    if RUN > 0:
        return runs_by_thread(x_ptr, first_line, first_pos, lines, length, ROWS, COLS, RUN)
    pos = first_pos + tl.arange(0, COLS)
    rows_ok = line_mask(first_line, first_inner, lines, inner, ROWS, TRANSPOSED)
    if TRANSPOSED:
        inn = first_inner + tl.arange(0, ROWS)
        offsets = outer * length * inner + pos.to(tl.int64)[:, None] * inner + inn[None, :]
        mask = (pos < length)[:, None] & rows_ok[None, :]
        return tl.trans(tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32))
    lin = first_line + tl.arange(0, ROWS)
    offsets = lin[:, None] * length + pos[None, :]
    mask = rows_ok[:, None] & (pos < length)[None, :]
    return tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.constexpr_function
def _run_of(hadamard, transposed):
    """The positions a thread holds in a row (`runs_by_thread`) for a transform of `hadamard`
    points along it, 8 to 32, so that the whole transform stays in the thread; otherwise 0,
    the load's own layout."""
    return hadamard if not transposed and 8 <= hadamard <= 32 else 0


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
    BY_SUMS: tl.constexpr = False,
    HADAMARD_SIGNS: tl.constexpr = -1,
):
    """The float32 tile at the origin, Hadamard-transformed along the axis when HADAMARD > 0
    (BY_SUMS: `hadamard_rows`' butterflies as sums over each pair; HADAMARD_SIGNS: its signs,
    -1 drawn from the seed, else a fixed mask)."""
    RUN: tl.constexpr = _run_of(HADAMARD, TRANSPOSED)
    x = load_tile(
        x_ptr, first_line, first_pos, outer, first_inner, lines, length, inner,
        ROWS, COLS, TRANSPOSED, RUN=RUN,
    )  # fmt: skip
    if HADAMARD > 0:
        rht_seed = seed_of(rht_seed_ptr, rht_seed_value, RHT_SEED_FROM_PTR)
        x = hadamard_rows(x, rht_seed, ROWS, COLS, HADAMARD, LOG2_HADAMARD, HADAMARD_NORM,
                          BY_SUMS, HADAMARD_SIGNS, ONE_WORD=RUN > 0)  # fmt: skip
    return x


@triton.jit
def load_program_tile(x_ptr, rows, cols, tiles_c, BR: tl.constexpr, BC: tl.constexpr):
    """(first row, first column, float32 tile) of this program's [BR, BC] tile of a contiguous
    (rows, cols) x, tiles numbered row of tiles by row of tiles, tiles_c to a row."""
    pid = tl.program_id(0)
    row0 = ((pid // tiles_c) * BR).to(tl.int64)
    col0 = ((pid % tiles_c) * BC).to(tl.int64)
    return row0, col0, load_tile(x_ptr, row0, col0, 0, 0, rows, cols, 1, BR, BC, False)


@triton.jit
def rounded_to_bf16(x):
    """float32 x rounded to the nearest bfloat16, ties to even, as float32: torch's
    `x.to(torch.bfloat16)` bit for bit (NaN stays NaN, overflow goes to Inf). Integer steps, so
    the interpreter gives the GPU's bits (its own float32 -> bfloat16 cast truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def store_column_sums(sums_ptr, tile, row0, col0, cols, tiles_c, BR: tl.constexpr,
                      BC: tl.constexpr):  # fmt: skip
    """The float32 sum of each column of this program's [BR, BC] tile (zeros past x's edge)
    into column (row tile) of the (cols, row tiles) partial sums that
    `tiling.partial_column_sums` allocates: a linear layer's bias gradient from a kernel's read
    of dY."""
    col_ids = col0 + tl.arange(0, BC)
    tiles_r = tl.num_programs(0) // tiles_c
    tl.store(sums_ptr + col_ids * tiles_r + row0 // BR, tl.sum(tile, axis=0), mask=col_ids < cols)


@triton.jit
def seed_of(seed_ptr, seed_value, FROM_PTR: tl.constexpr):
    """The seed (int64): a 1-element tensor's value plus the scalar argument (an offset), or
    the scalar argument alone. The sum wraps around as int64, like torch's."""
    if FROM_PTR:
        return tl.load(seed_ptr).to(tl.int64) + seed_value.to(tl.int64)
    return seed_value.to(tl.int64)


@triton.jit
def sr_bits(
    seed,
    first_line,
    first_pos,
    outer,
    first_inner,
    inner,
    out_length,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    GROUPED: tl.constexpr,
    SR_BITS: tl.constexpr = 24,
):
    """Random bits [ROWS, COLS] (uint32) for the tile: element (line, pos) draws at the
    row-major index of its place in the (transformed) input, (line, pos) or (outer, pos, inner).
    SR_BITS 24: each element's 32-bit word; 8 or 16: its field of that many bits
    (`carry_fields_at`). GROUPED: one Philox call per `group_size(SR_BITS)` elements along the
    contiguous dimension."""
    if TRANSPOSED:
        first = (outer * out_length + first_pos) * inner + first_inner
        if GROUPED:
            return tl.trans(_bits_rows(seed, first, inner, COLS, ROWS, SR_BITS))
        index = first + tl.arange(0, COLS).to(tl.int64)[:, None] * inner
        return tl.trans(_bits_at(seed, index + tl.arange(0, ROWS)[None, :], SR_BITS))
    first = first_line * out_length + first_pos
    if GROUPED:
        return _bits_rows(seed, first, out_length, ROWS, COLS, SR_BITS)
    index = first + tl.arange(0, ROWS).to(tl.int64)[:, None] * out_length
    return _bits_at(seed, index + tl.arange(0, COLS)[None, :], SR_BITS)


@triton.jit
def _bits_at(seed, index, SR_BITS: tl.constexpr):
    if SR_BITS == 24:
        return random_bits_at(seed, index)
    return carry_fields_at(seed, index, SR_BITS)


@triton.jit
def _bits_rows(seed, first_index, row_stride, ROWS: tl.constexpr, COLS: tl.constexpr,
               SR_BITS: tl.constexpr):  # fmt: skip
    if SR_BITS == 24:
        return random_bits_rows(seed, first_index, row_stride, ROWS, COLS)
    return carry_fields_rows(seed, first_index, row_stride, ROWS, COLS, SR_BITS)


@triton.jit
def carry_fields_at(seed, index, BITS: tl.constexpr):
    """BITS (8 or 16) random bits (uint32) for each int64 element index, as the reference's
    `random_bits.carry_fields`: index i takes field (i mod PER) of the word that index
    i // PER draws (`random_bits_at`), PER = 32 / BITS, the lowest field first."""
    PER: tl.constexpr = 32 // BITS
    words = random_bits_at(seed, index // PER)
    shifts = ((index % PER) * BITS).to(tl.uint32)
    return (words >> shifts) & ((1 << BITS) - 1)


@triton.jit
def carry_fields_rows(seed, first_index, row_stride, ROWS: tl.constexpr, COLS: tl.constexpr,
                      BITS: tl.constexpr):  # fmt: skip
    """`carry_fields_at` for the tile index[r, c] = first_index + r * row_stride + c, one
    Philox call per 128 / BITS elements (its four words, each PER fields). Needs first_index
    and row_stride divisible by 128 / BITS, and COLS too."""
    PER: tl.constexpr = 32 // BITS
    GROUP: tl.constexpr = 4 * PER
    rows = tl.arange(0, ROWS).to(tl.int64)[:, None]
    groups = tl.arange(0, COLS // GROUP).to(tl.int64)[None, :]
    w0, w1, w2, w3 = philox_words(seed, (first_index + rows * row_stride) // GROUP + groups)
    words = tl.join(tl.join(w0, w2), tl.join(w1, w3))  # [r, g, i, j] holds word 2 i + j
    words = tl.reshape(words, (ROWS, COLS // PER))  # [r, 4 g + word]
    shifts = (tl.arange(0, PER) * BITS).to(tl.uint32)[None, None, :]
    fields = (words[:, :, None] >> shifts) & ((1 << BITS) - 1)  # [r, 4 g + word, field]
    return tl.reshape(fields, (ROWS, COLS))


@triton.jit
def block_first_bits(
    seed, first_line, first_pos, outer, first_inner, inner, out_length, ROWS: tl.constexpr,
    COLS: tl.constexpr, BLOCK: tl.constexpr, TRANSPOSED: tl.constexpr,
):  # fmt: skip
    """Random bits [ROWS, COLS / BLOCK] (uint32): `sr_bits`' word of each block's first element
    (MS-EDEN's number for the block's scale)."""
    pos = first_pos + tl.arange(0, COLS // BLOCK).to(tl.int64) * BLOCK
    lines = tl.arange(0, ROWS).to(tl.int64)
    if TRANSPOSED:
        index = (outer * out_length + pos[None, :]) * inner + first_inner + lines[:, None]
    else:
        index = (first_line + lines)[:, None] * out_length + pos[None, :]
    return random_bits_at(seed, index)


@triton.jit
def block_first_bits_down(seed, first_row, first_col, cols, ROWS: tl.constexpr,
                          COLS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Random bits [ROWS / BLOCK, COLS] (uint32) of each block's first element, for blocks down
    the columns of a (rows, cols) tensor: element (r, c) draws at r * cols + c."""
    rows = first_row + tl.arange(0, ROWS // BLOCK).to(tl.int64) * BLOCK
    return random_bits_at(seed, rows[:, None] * cols + first_col + tl.arange(0, COLS)[None, :])


@triton.jit
def store_codes(
    codes_ptr,
    scales_ptr,
    code,
    scale_code,
    finite_blocks,
    first_line,
    first_pos,
    rows_ok,
    padded_length,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
    SIGNED_ZERO: tl.constexpr = False,
):
    """Packed codes (two per byte, low nibble first; zero in non-finite blocks; a code 8 stored
    as 0 unless SIGNED_ZERO) and scale codes, axis-last padded layout. code is
    [ROWS, blocks, BLOCK], finite_blocks [ROWS, blocks]; rows_ok [ROWS] says which of the
    tile's lines exist."""
    line_ids = first_line + tl.arange(0, ROWS)
    # Eight codes to a 32-bit word, element 8w + i in bits 4i..4i+3 (the bytes' nibble order on
    # a little-endian device), each word within one thread's run of the tile: no exchange of
    # values between threads, and word stores (padded_length is a multiple of 8).
    code = tl.where(finite_blocks[:, :, None], code, 0)
    groups = tl.reshape(code, (ROWS, COLS // 8, 8))
    words = tl.sum(groups << (tl.arange(0, 8) * 4)[None, None, :], axis=2)
    if not SIGNED_ZERO:
        # A code 8 (a negative value rounded to zero) becomes 0: a nibble keeps its sign bit
        # only where its magnitude bits are non-zero (magnitude + 7 carries into bit 3 then).
        magnitudes = words & 0x77777777
        words = magnitudes | (words & (magnitudes + 0x77777777) & -0x77777778)
    word_cols = first_pos // 8 + tl.arange(0, COLS // 8)
    word_mask = rows_ok[:, None] & (word_cols < padded_length // 8)[None, :]
    tl.store(
        codes_ptr.to(tl.pointer_type(tl.int32)) + line_ids[:, None] * (padded_length // 8)
        + word_cols[None, :],
        words,
        mask=word_mask,
    )  # fmt: skip
    n_blocks = padded_length // BLOCK
    block_cols = first_pos // BLOCK + tl.arange(0, COLS // BLOCK)
    block_mask = rows_ok[:, None] & (block_cols < n_blocks)[None, :]
    tl.store(
        scales_ptr + line_ids[:, None] * n_blocks + block_cols[None, :],
        scale_code.to(tl.uint8),
        mask=block_mask,
    )


@triton.jit
def store_values(
    out_ptr,
    values,
    first_line,
    first_pos,
    outer,
    first_inner,
    rows_ok,
    out_length,
    inner,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    TRANSPOSED: tl.constexpr,
):
    """Values [ROWS, COLS] into the (transformed) input's own layout."""
    values = values.to(out_ptr.dtype.element_ty)
    pos = first_pos + tl.arange(0, COLS)
    if TRANSPOSED:
        inn = first_inner + tl.arange(0, ROWS)
        offsets = (outer * out_length + pos.to(tl.int64)[:, None]) * inner + inn[None, :]
        mask = (pos < out_length)[:, None] & rows_ok[None, :]
        tl.store(out_ptr + offsets, tl.trans(values), mask=mask)
    else:
        lin = first_line + tl.arange(0, ROWS)
        offsets = lin[:, None] * out_length + pos[None, :]
        mask = rows_ok[:, None] & (pos < out_length)[None, :]
        tl.store(out_ptr + offsets, values, mask=mask)


@triton.jit
def store_codes_down(
    codes_ptr,
    scales_ptr,
    code,
    scale_code,
    finite_blocks,
    first_row,
    first_col,
    cols_ok,
    padded_rows,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """`store_codes` for blocks along a tile's first axis: code [ROWS / BLOCK, BLOCK, COLS],
    scale codes and finite_blocks [ROWS / BLOCK, COLS], into the axis-last layout of the input's
    columns ((cols, padded_rows / 2) codes, (cols, padded_rows / BLOCK) scale codes)."""
    pairs = tl.permute(tl.reshape(code, (ROWS // 2, 2, COLS)), (0, 2, 1))  # rows 2i and 2i + 1
    low, high = tl.split(pairs)
    finite = tl.reshape(
        tl.broadcast_to(tl.expand_dims(finite_blocks, 1), (ROWS // BLOCK, BLOCK // 2, COLS)),
        (ROWS // 2, COLS),
    )
    packed = tl.trans(tl.where(finite, low | (high << 4), 0).to(tl.uint8))  # [COLS, ROWS / 2]
    col_ids = (first_col + tl.arange(0, COLS)).to(tl.int64)
    byte_rows = first_row // 2 + tl.arange(0, ROWS // 2)
    byte_mask = cols_ok[:, None] & (byte_rows < padded_rows // 2)[None, :]
    tl.store(codes_ptr + col_ids[:, None] * (padded_rows // 2) + byte_rows[None, :], packed,
             mask=byte_mask)  # fmt: skip
    n_blocks = padded_rows // BLOCK
    block_rows = first_row // BLOCK + tl.arange(0, ROWS // BLOCK)
    block_mask = cols_ok[:, None] & (block_rows < n_blocks)[None, :]
    tl.store(scales_ptr + col_ids[:, None] * n_blocks + block_rows[None, :],
             tl.trans(scale_code.to(tl.uint8)), mask=block_mask)  # fmt: skip


@triton.jit
def store_outer_amax(
    amax_ptr, outer_amax, first_line, first_pos, lines_ok, padded_length, BLOCK_AXIS: tl.constexpr,
    LINES: tl.constexpr, LENGTH: tl.constexpr, BLOCK: tl.constexpr, OUTER: tl.constexpr,
):  # fmt: skip
    """Each outer block's A (`quantize_tile`'s per-block outer amaxes: [LINES, LENGTH / BLOCK]
    for blocks along the tile's rows, BLOCK_AXIS 1; [LENGTH / BLOCK, LINES] down its columns,
    0), float32, into the (lines, ceil(padded_length / (OUTER * BLOCK))) layout of the lines
    the blocks run along; the tile's `LINES` lines start at first_line (lines_ok: which
    exist), its `LENGTH` positions at first_pos."""
    if BLOCK_AXIS == 1:
        runs = tl.reshape(outer_amax, (LINES, LENGTH // (BLOCK * OUTER), OUTER))
        per_outer = tl.max(runs, axis=2)
    else:
        runs = tl.reshape(outer_amax, (LENGTH // (BLOCK * OUTER), OUTER, LINES))
        per_outer = tl.trans(tl.max(runs, axis=1))
    n_outer = (padded_length + BLOCK * OUTER - 1) // (BLOCK * OUTER)
    line_ids = (first_line + tl.arange(0, LINES)).to(tl.int64)
    outer_ids = first_pos // (BLOCK * OUTER) + tl.arange(0, LENGTH // (BLOCK * OUTER))
    mask = lines_ok[:, None] & (outer_ids < n_outer)[None, :]
    tl.store(amax_ptr + line_ids[:, None] * n_outer + outer_ids[None, :], per_outer, mask=mask)
