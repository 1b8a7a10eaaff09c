"""Exact order statistics of rows without sorting: the values of two given ranks per row (the
clamp thresholds of Wang et al.'s per-row outlier clamp, `vector_wise.rows_kernel`).

Each value becomes an int32 key ordered as `torch.sort` orders floats (`order_key`). The key
of rank r is the largest key t with at most r keys below it, found bit by bit from the top:
one counting pass over the row per bit, both ranks' counts in one reduction (`search_keys`).

Passes are saved with bounds that cost a reduction, not a search (`_bounds`): split the row's
keys in registers into s groups; each group's maximum is a key, so at least s keys lie at or
above the smallest group maximum, and with s at least the number of keys at or above rank
r's, that key is a floor for it; the row's largest key is a ceiling. Likewise below with the
group minima. The search then builds only the offset from the floor, over the bits of the
widest interval.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tile_io import block_at

INT32_MIN = tl.constexpr(-2147483648)
INT32_MAX = tl.constexpr(2147483647)


@triton.jit
def order_key(x):
    """An int32 key per float32 value, ordered as torch.sort orders the values: +|x| bits for
    x >= 0, -|x| bits below (so -0.0 and +0.0 share the key 0, as they compare equal), NaN
    (any sign) after +Inf. A value whose low bits are zero (a bf16 or fp16 value in float32)
    keeps them zero in its key."""
    bits = x.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    key = tl.where(bits < 0, -magnitude, magnitude)
    return tl.where(x != x, INT32_MAX, key)


@triton.jit
def key_value(key):
    """The float32 value of an order key (NaN for the NaN key)."""
    bits = tl.where(key < 0, (-key) | INT32_MIN, key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _packed_counts(keys, trial_low, trial_high):
    """Per row, (keys below trial_low) + (keys below trial_high) << 16: one reduction for both
    counts (a row in registers holds fewer than 2^16 values)."""
    packed = (keys < trial_low[:, None]).to(tl.int32)
    packed += (keys < trial_high[:, None]).to(tl.int32) << 16
    return tl.sum(packed, axis=1)


@triton.jit
def _counts_below(keys, tail_keys, x_ptr, first_row, R, C, trial_low, trial_high,
                  BR: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr,
                  TAIL: tl.constexpr):  # fmt: skip
    """How many keys of each row lie below trial_low and below trial_high ([BR] each): from
    the register tiles `keys` and (TAIL > 0) `tail_keys`, or by reading the rows chunk by
    chunk."""
    if ONE_CHUNK:
        both = _packed_counts(keys, trial_low, trial_high)
        if TAIL > 0:
            both += _packed_counts(tail_keys, trial_low, trial_high)
        below_low, below_high = both & 0xFFFF, both >> 16
    else:
        below_low = tl.zeros([BR], tl.int32)
        below_high = tl.zeros([BR], tl.int32)
        for start in range(0, C, BC):
            offsets, mask = block_at(first_row, start, R, C, BR, BC)
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            chunk_keys = tl.where(mask, order_key(x), INT32_MAX)
            below_low += tl.sum((chunk_keys < trial_low[:, None]).to(tl.int32), axis=1)
            below_high += tl.sum((chunk_keys < trial_high[:, None]).to(tl.int32), axis=1)
    return below_low, below_high


@triton.jit
def search_keys(keys, tail_keys, x_ptr, first_row, R, C, low_rank, high_rank,
                floor_low, floor_high, width_low, width_high, span, BR: tl.constexpr,
                BC: tl.constexpr, ONE_CHUNK: tl.constexpr, TAIL: tl.constexpr,
                ZERO_BITS: tl.constexpr):  # fmt: skip
    """The keys of ascending ranks low_rank and high_rank of each row ([BR] int32 each; the
    row in registers as `_counts_below` takes it, or read), each known to lie in
    [floor, floor + width] (width uint32).

    The key is floor + o for the largest o <= width with at most `rank` keys below floor + o,
    o built bit by bit from the top: a bit is kept when the trial with it qualifies. span (a
    scalar uint32, the OR of every width) has no bit above the top bit of any o, so no pass
    counts for those. The low ZERO_BITS bits of o stay zero: every key has them zero (16 for
    bf16 values, 13 for fp16), as floor must; for the NaN rank the result decodes to NaN."""
    offset_low = tl.zeros([BR], tl.uint32)
    offset_high = offset_low
    start_low = floor_low.to(tl.uint32, bitcast=True)
    start_high = floor_high.to(tl.uint32, bitcast=True)
    for step in tl.static_range(32 - ZERO_BITS):
        bit = 1 << (31 - step)
        if (span >> (31 - step)) != 0:
            try_low, try_high = offset_low | bit, offset_high | bit
            trial_low = (start_low + try_low).to(tl.int32, bitcast=True)
            trial_high = (start_high + try_high).to(tl.int32, bitcast=True)
            below_low, below_high = _counts_below(
                keys, tail_keys, x_ptr, first_row, R, C, trial_low, trial_high,
                BR, BC, ONE_CHUNK, TAIL,
            )  # fmt: skip
            offset_low = tl.where((below_low <= low_rank) & (try_low <= width_low),
                                  try_low, offset_low)  # fmt: skip
            offset_high = tl.where((below_high <= high_rank) & (try_high <= width_high),
                                   try_high, offset_high)  # fmt: skip
    low = (start_low + offset_low).to(tl.int32, bitcast=True)
    return low, (start_high + offset_high).to(tl.int32, bitcast=True)


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _unbounded(BR: tl.constexpr):
    """(floor, width) of a search over every int32 key."""
    return tl.full([BR], INT32_MIN, tl.int32), tl.full([BR], 0xFFFFFFFF, tl.uint32)


@triton.jit
def _width(floor, ceiling):
    """ceiling - floor as uint32 (ceiling >= floor)."""
    return ceiling.to(tl.uint32, bitcast=True) - floor.to(tl.uint32, bitcast=True)


@triton.jit
def group_bound(keys, BR: tl.constexpr, BC: tl.constexpr, SPLIT: tl.constexpr,
                UPPER: tl.constexpr):  # fmt: skip
    """Per row ([BR]), its first BC keys (`keys`, lanes outside the tensor INT32_MIN when UPPER,
    else INT32_MAX) in SPLIT groups: the smallest group maximum (UPPER), at or below SPLIT of
    the row's keys, or the largest group minimum, at or above SPLIT keys. Group g holds the
    columns congruent to g modulo SPLIT (any partition bounds alike), so that the reshape leaves
    each value in its thread (a one-warp row compiles to no shared memory for it; a second read
    of the head in groups of contiguous columns took longer). For one row the bound is reduced
    to a scalar, so that no layout ties it to the row's tile. Rows past the tensor give
    INT32_MIN (UPPER) or INT32_MAX."""
    groups = tl.reshape(keys, [BR, BC // SPLIT, SPLIT])
    if UPPER:
        bound = tl.min(tl.max(groups, axis=1), axis=1)
    else:
        bound = tl.max(tl.min(groups, axis=1), axis=1)
    if BR == 1:
        bound = tl.full([BR], tl.sum(bound, axis=0), tl.int32)
    return bound


@triton.jit
def _bounds(keys, mask, tail_keys, tail_mask, BR: tl.constexpr, BC: tl.constexpr,
            TAIL: tl.constexpr, SPLIT_LOW: tl.constexpr, SPLIT_HIGH: tl.constexpr,
            ZERO_BITS: tl.constexpr):  # fmt: skip
    """(floor_low, width_low, floor_high, width_high) for `search_keys`. The key of rank
    low_rank lies between the row's smallest key and the largest minimum of SPLIT_LOW >=
    low_rank + 1 groups of the row's first BC keys; that of rank high_rank between the
    smallest maximum of SPLIT_HIGH >= C - high_rank such groups and the row's largest key
    (SPLIT 0: no such bound). Floors lose their low ZERO_BITS bits (still lower bounds)."""
    keys_or_min = tl.where(mask, keys, INT32_MIN)  # lanes outside the tensor below every key
    smallest = tl.min(keys, axis=1)
    largest = tl.max(keys_or_min, axis=1)
    if TAIL > 0:
        smallest = tl.minimum(smallest, tl.min(tail_keys, axis=1))
        largest = tl.maximum(largest, tl.max(tl.where(tail_mask, tail_keys, INT32_MIN), axis=1))
    floor_low = smallest & -(1 << ZERO_BITS)
    ceiling_low = tl.full([BR], INT32_MAX, tl.int32)
    if SPLIT_LOW > 0:
        ceiling_low = tl.maximum(group_bound(keys, BR, BC, SPLIT_LOW, False), floor_low)
    floor_high = tl.full([BR], INT32_MIN, tl.int32)
    if SPLIT_HIGH > 0:
        floor_high = group_bound(keys_or_min, BR, BC, SPLIT_HIGH, True) & -(1 << ZERO_BITS)
    return floor_low, _width(floor_low, ceiling_low), floor_high, _width(floor_high, largest)


@triton.jit
def row_thresholds(keys, mask, tail_keys, tail_mask, x_ptr, first_row, R, C,
                   low_rank, high_rank, BR: tl.constexpr, BC: tl.constexpr,
                   TAIL: tl.constexpr, SPLIT_LOW: tl.constexpr, SPLIT_HIGH: tl.constexpr,
                   ZERO_BITS: tl.constexpr):  # fmt: skip
    """The values of 0-based ascending ranks low_rank and high_rank of each row ([BR]
    float32), from the rows' keys in registers (`keys` [BR, BC] with `mask`, then TAIL more
    when TAIL > 0, lanes outside the masks holding INT32_MAX), the search bounded as `_bounds`
    says."""
    floor_low, width_low, floor_high, width_high = _bounds(
        keys, mask, tail_keys, tail_mask, BR, BC, TAIL, SPLIT_LOW, SPLIT_HIGH, ZERO_BITS
    )
    span = tl.reduce(width_low | width_high, 0, _bit_or)
    low, high = search_keys(
        keys, tail_keys, x_ptr, first_row, R, C, low_rank, high_rank,
        floor_low, floor_high, width_low, width_high, span, BR, BC, True, TAIL, ZERO_BITS,
    )  # fmt: skip
    return key_value(low), key_value(high)


@triton.jit
def read_row_thresholds(x_ptr, first_row, R, C, low_rank, high_rank, BR: tl.constexpr,
                        BC: tl.constexpr, ZERO_BITS: tl.constexpr):  # fmt: skip
    """`row_thresholds` of rows too long for registers, read chunk by chunk of BC columns in
    every pass (every bit counted: no bounds)."""
    floor, width = _unbounded(BR)
    # no keys in registers: `search_keys` reads the rows, its key tiles stand unused
    low, high = search_keys(
        floor, floor, x_ptr, first_row, R, C, low_rank, high_rank,
        floor, floor, width, width, 0xFFFFFFFF, BR, BC, False, 0, ZERO_BITS,
    )  # fmt: skip
    return key_value(low), key_value(high)
