"""Per-row facts the MXFP4 GEMM's two operands need before their product, and their staged
copies, for both operands in one launch.

For each row of an operand blocked along K (codes (rows, K/2) uint8, scale codes
(rows, K/BLOCK) uint8, K padded to whole blocks) the kernel writes its reference, the largest
block scale code (127 for a row holding a NaN block), and flags: 1 = a NaN block, 2 = a nonzero
block more than 26 binades below the reference (beyond E5M2's fold range), 4 = a nonzero block
of the INT8 segment more than 3 below that segment's reference (beyond INT8's), or flag 2;
flags 2 and 4, which only the exact GEMM's tiers read, only when asked (TIER_FLAGS: they read
every code word). It also writes, as asked, the operand folded into INT8, E5M2 and E4M3
against each row's reference (`gemm.words`; blocks beyond a format's range flushed), and each
row's E4M3 scale 2^(ref - 127 - 6) as float32 (NaN for a NaN row).

K split (SPLIT, `gemm.split`): the staged copies hold K's 32-wide windows in the split's order,
the window `source[slot]` at slot `slot` (both operands alike, so their product is the same
sum); the slots from `lo_start` on are the INT8 segment, folded into INT8 against the row's
largest scale over those slots (its segment reference, at least the reference - GAP_LIMIT),
the rest only in E5M2. Without SPLIT the windows keep their order and all of K is the INT8
segment (its reference is the row's).

Outputs, rows of A then rows of B (R = rows_a + rows_b): facts (3, R) int32 (references,
flags, INT8 segment references); staged (formats, R, K) bytes, in the order INT8, E5M2, E4M3
of those written; E4M3 scales (R,) float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.tiles import E8M0_NAN
from fp4cli.kernels.gemm.words import (
    FORMAT_E4M3,
    FORMAT_E5M2,
    FORMAT_INT8,
    decode_words,
    fold_range,
)
from fp4cli.kernels.tiles.tile_ops import pow2

FLAG_NAN = tl.constexpr(1)
FLAG_BEYOND_E5M2 = tl.constexpr(2)
FLAG_BEYOND_INT8 = tl.constexpr(4)
E4M3_TOP = tl.constexpr(6)  # E4M3 staging: the largest block's values are q * 2^6
# the INT8 segment's reference lies at most this far below the row's: the GEMM scales its int32
# sums by 2^-(gap - 9) per operand into the FP8 frame, kept a normal float32 (gemm.int8)
GAP_LIMIT = tl.constexpr(60)


@triton.jit
def source_windows(source_ptr, slot, slot_ok):
    """The K window (32 wide) each staged slot holds in the split's order. Callers read it only
    where the split moves a window (lo_start > 0), else the slot itself, whose contiguous
    loads the compiler can widen."""
    return tl.load(source_ptr + slot, mask=slot_ok, other=0)


@triton.jit
def load_windows(code_words_ptr, row64, ok, window, n_words):
    """[rows, windows, 4] code words (uint32) of the given 32-code K windows: a window's 4 words
    in the last axis, one block's (blocks are whole windows)."""
    word = window[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
    words = tl.load(code_words_ptr + row64[:, None, None] * n_words + word, mask=ok[:, :, None],
                    other=0)  # fmt: skip
    return words.to(tl.uint32, bitcast=True)


@triton.jit
def load_scale_codes(scales_ptr, row64, mask, window, n_blocks, BLOCK: tl.constexpr):
    """[rows, windows] int32 scale codes of the blocks holding the given K windows."""
    block = window * 32 // BLOCK
    codes = tl.load(scales_ptr + row64[:, None] * n_blocks + block[None, :], mask=mask, other=0)
    return codes.to(tl.int32)


@triton.jit
def row_references(scales_ptr, source_ptr, lo_start, row64, row_ok, n_windows, n_blocks,
                   ROWS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """(the largest scale code of each row, the largest over its INT8 segment's slots), int32."""
    top = tl.zeros([ROWS], tl.int32)
    top_lo = tl.zeros([ROWS], tl.int32)
    for s0 in range(0, n_windows, CHUNK):
        slot = s0 + tl.arange(0, CHUNK)
        slot_ok = slot < n_windows
        mask = row_ok[:, None] & slot_ok[None, :]
        if lo_start > 0:
            window = source_windows(source_ptr, slot, slot_ok)
            codes = load_scale_codes(scales_ptr, row64, mask, window, n_blocks, BLOCK)
        else:
            codes = load_scale_codes(scales_ptr, row64, mask, slot, n_blocks, BLOCK)
        top = tl.maximum(top, tl.max(codes, axis=1))
        in_lo = (slot >= lo_start)[None, :]
        top_lo = tl.maximum(top_lo, tl.max(tl.where(in_lo, codes, 0), axis=1))
    return top, top_lo


@triton.jit
def store_staged(out_ptr, words, below, out_row64, slot, ok, n_out_words,
                 FORMAT: tl.constexpr):  # fmt: skip
    """Fold [R, S, 4] code words into FORMAT (`below`: [R, S] binades) and store them as the
    [R, S, 8] output words of staged slots `slot`."""
    out = decode_words(words, fold_range(FORMAT) - below[:, :, None], FORMAT)
    out_word = slot[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    tl.store(
        out_ptr + out_row64[:, None, None] * n_out_words + out_word,
        out.to(tl.int32, bitcast=True),
        mask=ok[:, :, None],
    )


@triton.jit
def prepare_rows(
    code_words_ptr, scales_ptr, staged_ptr, facts_ptr, e4m3_scale_ptr, source_ptr, lo_start_ptr,
    program, rows, first_row, all_rows, k_padded,
    ROWS: tl.constexpr, WORDS: tl.constexpr, SCALE_CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    WRITE_INT8: tl.constexpr, WRITE_E5M2: tl.constexpr, WRITE_E4M3: tl.constexpr,
    TIER_FLAGS: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """One program's ROWS rows of one operand; its outputs start at row `first_row` of the
    outputs' `all_rows`. Flags 2 and 4 are computed only with TIER_FLAGS (else left 0)."""
    row = program * ROWS + tl.arange(0, ROWS)
    row_ok = row < rows
    row64 = row.to(tl.int64)
    out_row64 = row64 + first_row
    n_blocks = k_padded // BLOCK
    n_words = k_padded // 32 * 4  # whole windows: 16-byte aligned rows, for wide loads
    lo_start = 0
    if SPLIT:
        lo_start = tl.load(lo_start_ptr)
    top, top_lo = row_references(scales_ptr, source_ptr, lo_start, row64, row_ok, k_padded // 32,
                                 n_blocks, ROWS, SCALE_CHUNK, BLOCK)  # fmt: skip
    has_nan = top == E8M0_NAN
    ref = tl.where(has_nan, 127, top)
    ref_lo = tl.maximum(tl.where(has_nan, 127, top_lo), ref - GAP_LIMIT)
    SLOTS: tl.constexpr = WORDS // 4  # 32-code windows a step, 4 code words each
    n_windows = n_words // 4
    beyond_e5m2 = tl.zeros([ROWS, SLOTS], tl.int1)  # reduced over slots after the loop
    beyond_int8 = tl.zeros([ROWS, SLOTS], tl.int1)
    format_words = tl.cast(all_rows, tl.int64) * (2 * n_words)  # one staged format, in words
    for s0 in range(0, n_windows, SLOTS):
        slot = s0 + tl.arange(0, SLOTS)  # in staged order
        slot_ok = slot < n_windows
        ok = row_ok[:, None] & slot_ok[None, :]
        window = slot
        if lo_start > 0:  # the split moves windows: each slot's words from its source window
            window = source_windows(source_ptr, slot, slot_ok)
        words = load_windows(code_words_ptr, row64, ok, window, n_words)
        scale_codes = load_scale_codes(scales_ptr, row64, ok, window, n_blocks, BLOCK)
        below = ref[:, None] - scale_codes  # binades below the row's top block
        below_lo = ref_lo[:, None] - scale_codes  # below the INT8 segment's top
        in_lo = (slot >= lo_start)[None, :]
        if TIER_FLAGS:
            nonzero = (tl.max((words & 0x77777777).to(tl.int32, bitcast=True), axis=2) != 0) & ok
            beyond_e5m2 = beyond_e5m2 | (nonzero & (below > fold_range(FORMAT_E5M2)))
            beyond_int8 = beyond_int8 | (nonzero & in_lo & (below_lo > fold_range(FORMAT_INT8)))
        out_ptr = staged_ptr
        if WRITE_INT8:
            store_staged(out_ptr, words, below_lo, out_row64, slot, ok, 2 * n_words, FORMAT_INT8)
            out_ptr += format_words
        if WRITE_E5M2:
            store_staged(out_ptr, words, below, out_row64, slot, ok, 2 * n_words, FORMAT_E5M2)
            out_ptr += format_words
        if WRITE_E4M3:
            store_staged(out_ptr, words, below, out_row64, slot, ok, 2 * n_words, FORMAT_E4M3)
    wide = tl.max(beyond_e5m2.to(tl.int32), axis=1)
    narrow = tl.maximum(tl.max(beyond_int8.to(tl.int32), axis=1), wide)  # flag 2 implies 4
    tiers = wide * FLAG_BEYOND_E5M2 + narrow * FLAG_BEYOND_INT8
    flags = tl.where(has_nan, FLAG_NAN, tiers)
    tl.store(facts_ptr + out_row64, ref, mask=row_ok)
    tl.store(facts_ptr + all_rows + out_row64, flags, mask=row_ok)
    tl.store(facts_ptr + 2 * all_rows + out_row64, ref_lo, mask=row_ok)
    if WRITE_E4M3:
        scale = tl.where(has_nan, float("nan"), pow2(ref - 127 - E4M3_TOP))
        tl.store(e4m3_scale_ptr + out_row64, scale, mask=row_ok)


@triton.jit
def operand_prep_kernel(
    a_code_words_ptr, a_scales_ptr, b_code_words_ptr, b_scales_ptr,
    staged_ptr, facts_ptr, e4m3_scale_ptr, source_ptr, lo_start_ptr, rows_a, rows_b, k_padded,
    ROWS: tl.constexpr, WORDS: tl.constexpr, SCALE_CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    WRITE_INT8: tl.constexpr, WRITE_E5M2: tl.constexpr, WRITE_E4M3: tl.constexpr,
    TIER_FLAGS: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """The first cdiv(rows_a, ROWS) programs prepare A, the rest B. Code words: each operand's
    codes as (rows, K/8) int32; staged: the (formats, R, K) bytes as int32 words; with SPLIT,
    source (K/32,) int32 and lo_start (1,) int32 (`gemm.split`)."""
    pid = tl.program_id(0)
    programs_a = tl.cdiv(rows_a, ROWS)
    if pid < programs_a:
        prepare_rows(a_code_words_ptr, a_scales_ptr, staged_ptr, facts_ptr, e4m3_scale_ptr,
                     source_ptr, lo_start_ptr, pid, rows_a, 0, rows_a + rows_b, k_padded, ROWS,
                     WORDS, SCALE_CHUNK, BLOCK, WRITE_INT8, WRITE_E5M2, WRITE_E4M3, TIER_FLAGS,
                     SPLIT)  # fmt: skip
    else:
        prepare_rows(b_code_words_ptr, b_scales_ptr, staged_ptr, facts_ptr, e4m3_scale_ptr,
                     source_ptr, lo_start_ptr, pid - programs_a, rows_b, rows_a, rows_a + rows_b,
                     k_padded, ROWS, WORDS, SCALE_CHUNK, BLOCK, WRITE_INT8, WRITE_E5M2,
                     WRITE_E4M3, TIER_FLAGS, SPLIT)  # fmt: skip
