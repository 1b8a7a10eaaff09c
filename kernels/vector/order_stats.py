"""Exact order statistics of rows without sorting: the values of two given ranks per row (the
clamp thresholds of Wang et al.'s per-row outlier clamp, `vector_wise.rows_kernel`).

Each value becomes an int32 key ordered as `torch.sort` orders floats (`order_key`). The key
of rank r is the largest key t with at most r keys below it, found bit by bit from the top:
one counting pass per bit, both ranks' counts in one reduction (`search_keys`).

A row held in registers is searched over candidates, not over all its keys (`row_thresholds`):
the two smallest and the two largest keys of each group of a few consecutive columns
(`extreme_pairs`, one reduction of pairs inside each thread; under the interpreter, which runs
a combine function value by value, standard reductions that give the same pairs). The keys
below the lower threshold and those at or above the upper one are few; when no group holds
more than two of either, they are all candidates, the candidates' counts are the row's wherever
the search needs them, and the search over them finds the same keys. One count over the whole
row at the two keys found says whether that held; a program where it did not for some row
searches its rows again over every key.

Passes are saved with bounds that cost a reduction of the candidates (`_bounds`): split the
row's groups into s sets; each set's maximum is a key, so at least s keys lie at or above the
smallest set maximum, and with s at least the number of keys at or above rank r's, that key is
a floor for it; the row's largest key is a ceiling. Likewise below with the set minima. The
search then builds only the offset from the floor, over the bits of the widest interval.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_io import block_at
from fp4cli.quant.backend import interpreter_on

INT32_MIN = tl.constexpr(-2147483648)
INT32_MAX = tl.constexpr(2147483647)
CANDIDATE_GROUP = 8  # consecutive columns a pair of candidates per side is taken from
PAIRS_BY_COMBINE = tl.constexpr(not interpreter_on())


def candidate_groups(head: int, tail: int) -> tuple[int, int]:
    """(GROUP, TAIL_GROUP): the columns of a row's head and tail (`row_thresholds`) that give
    one pair of candidates each side (the tail's 1 when it has no columns)."""
    return min(CANDIDATE_GROUP, head), max(1, min(CANDIDATE_GROUP, tail))


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
def abs_bits(x):
    """The bits of |x| (float32) as int32."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _packed_below(low_keys, high_keys, trial_low, trial_high):
    """Per key, (below trial_low) + (below trial_high) << 16."""
    packed = (low_keys < trial_low[:, None]).to(tl.int32)
    return packed + ((high_keys < trial_high[:, None]).to(tl.int32) << 16)


@triton.jit
def _packed_counts(low_tiles, high_tiles, trial_low, trial_high):
    """Per row, (keys of `low_tiles` below trial_low) + (keys of `high_tiles` below trial_high)
    << 16 (a row in registers holds fewer than 2^16 values). The tiles come as a tuple of
    tuples of tiles of one shape, added before one reduction a shape."""
    both = tl.zeros_like(trial_low)
    for i in tl.static_range(len(low_tiles)):
        low_shaped, high_shaped = low_tiles[i], high_tiles[i]
        packed = _packed_below(low_shaped[0], high_shaped[0], trial_low, trial_high)
        for j in tl.static_range(1, len(low_shaped)):
            packed += _packed_below(low_shaped[j], high_shaped[j], trial_low, trial_high)
        both += tl.sum(packed, axis=1)
    return both


@triton.jit
def _counts_below(low_tiles, high_tiles, x_ptr, first_row, R, C, trial_low, trial_high,
                  BR: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr):  # fmt: skip
    """How many keys of each row lie below trial_low and below trial_high ([BR] each): the
    first counted in the register tiles `low_tiles`, the second in `high_tiles` (tuples as
    `_packed_counts` takes them: the same tiles for a row in registers, candidates for a
    search over them), or both by reading the rows chunk by chunk."""
    if ONE_CHUNK:
        both = _packed_counts(low_tiles, high_tiles, trial_low, trial_high)
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
def search_keys(low_tiles, high_tiles, x_ptr, first_row, R, C, low_rank, high_rank,
                high_unseen, floor_low, floor_high, width_low, width_high, span,
                BR: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr,
                ZERO_BITS: tl.constexpr):  # fmt: skip
    """The keys of ascending ranks low_rank and high_rank of each row ([BR] int32 each), the
    keys counted as `_counts_below` takes them (high_unseen added to each count of the upper
    rank: the keys its tiles leave out, all below its trials), each known to lie in
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
                low_tiles, high_tiles, x_ptr, first_row, R, C, trial_low, trial_high,
                BR, BC, ONE_CHUNK,
            )  # fmt: skip
            offset_low = tl.where((below_low <= low_rank) & (try_low <= width_low),
                                  try_low, offset_low)  # fmt: skip
            offset_high = tl.where((below_high + high_unseen <= high_rank)
                                   & (try_high <= width_high), try_high, offset_high)  # fmt: skip
    low = (start_low + offset_low).to(tl.int32, bitcast=True)
    return low, (start_high + offset_high).to(tl.int32, bitcast=True)


@triton.jit
def _count_outside(key_tiles, low, high):
    """Per row, the keys of the tiles (a tuple) below low or at or above high (low <= high):
    as uint32, key - low wraps past high - low exactly for those."""
    start = low.to(tl.uint32, bitcast=True)
    width = high.to(tl.uint32, bitcast=True) - start
    count = tl.zeros_like(low)
    for i in tl.static_range(len(key_tiles)):
        offset = key_tiles[i].to(tl.uint32, bitcast=True) - start[:, None]
        count += tl.sum((offset >= width[:, None]).to(tl.int32), axis=1)
    return count


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _larger_two(first_a, second_a, first_b, second_b):
    """The two largest keys of two pairs, each pair (largest, second largest)."""
    first = tl.maximum(first_a, first_b)
    return first, tl.maximum(tl.minimum(first_a, first_b), tl.maximum(second_a, second_b))


@triton.jit
def _smaller_two(first_a, second_a, first_b, second_b):
    """The two smallest keys of two pairs, each pair (smallest, second smallest)."""
    first = tl.minimum(first_a, first_b)
    return first, tl.minimum(tl.maximum(first_a, first_b), tl.minimum(second_a, second_b))


@triton.jit
def _pair_by_reductions(groups, UPPER: tl.constexpr):
    """`extreme_pairs` of [BR, G, GROUP] groups from standard reductions: the extreme, and the
    extreme of the rest unless the extreme is held twice."""
    if UPPER:
        first = tl.max(groups, axis=2)
        rest = tl.max(tl.where(groups < first[:, :, None], groups, INT32_MIN), axis=2)
    else:
        first = tl.min(groups, axis=2)
        rest = tl.min(tl.where(groups > first[:, :, None], groups, INT32_MAX), axis=2)
    held = tl.sum((groups == first[:, :, None]).to(tl.int32), axis=2)
    return first, tl.where(held > 1, first, rest)


@triton.jit
def extreme_pairs(keys, BR: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr,
                  UPPER: tl.constexpr, BY_COMBINE: tl.constexpr):  # fmt: skip
    """(first, second) [BR, N // GROUP] each: per group of GROUP consecutive columns of keys
    [BR, N], its largest and second largest key (UPPER), or its smallest and second smallest
    (a key held twice is both). The columns of a group lie in one thread. BY_COMBINE: one
    reduction of pairs (on a GPU); else `_pair_by_reductions` (the interpreter runs a combine
    function value by value), the same pairs."""
    groups = tl.reshape(keys, [BR, N // GROUP, GROUP])
    if BY_COMBINE:
        if UPPER:
            unset = tl.full([BR, N // GROUP, GROUP], INT32_MIN, tl.int32)
            first, second = tl.reduce((groups, unset), 2, _larger_two)
        else:
            unset = tl.full([BR, N // GROUP, GROUP], INT32_MAX, tl.int32)
            first, second = tl.reduce((groups, unset), 2, _smaller_two)
    else:
        first, second = _pair_by_reductions(groups, UPPER)
    return first, second


@triton.jit
def _unplaced(row_values, BR: tl.constexpr):
    """row_values ([BR]) as they are, or for one row re-splat from a scalar, so that no layout
    ties them to the tile they were reduced from (the tiles of candidates, of keys and of the
    row's values each keep their own)."""
    if BR == 1:
        row_values = tl.full([BR], tl.sum(row_values, axis=0), row_values.dtype)
    return row_values


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
    """Per row ([BR]), its keys [BR, BC] (group maxima when UPPER, lanes outside the tensor
    INT32_MIN; else group minima, lanes outside INT32_MAX) in SPLIT sets: the smallest set
    maximum (UPPER), at or below SPLIT of the row's keys, or the largest set minimum, at or
    above SPLIT keys. Set s holds the columns congruent to s modulo SPLIT (any partition bounds
    alike). For one row the bound is reduced to a scalar, so that no layout ties it to the
    row's tile. Rows past the tensor give INT32_MIN (UPPER) or INT32_MAX."""
    groups = tl.reshape(keys, [BR, BC // SPLIT, SPLIT])
    if UPPER:
        bound = tl.min(tl.max(groups, axis=1), axis=1)
    else:
        bound = tl.max(tl.min(groups, axis=1), axis=1)
    return _unplaced(bound, BR)


@triton.jit
def _bounds(low_first, high_first, low_tail_first, high_tail_first, BR: tl.constexpr,
            GROUPS: tl.constexpr, TAIL: tl.constexpr, SPLIT_LOW: tl.constexpr,
            SPLIT_HIGH: tl.constexpr, ZERO_BITS: tl.constexpr):  # fmt: skip
    """(floor_low, width_low, floor_high, width_high, largest) for `search_keys`, from the groups'
    minima (`low_first`, GROUPS of them in the head) and maxima (`high_first`). The key of
    rank low_rank lies between the row's smallest key and the largest minimum of SPLIT_LOW >=
    low_rank + 1 sets of the head's groups; that of rank high_rank between the smallest
    maximum of SPLIT_HIGH >= C - high_rank such sets and the row's largest key (SPLIT 0: no
    such bound). Floors lose their low ZERO_BITS bits (still lower bounds)."""
    smallest = tl.min(low_first, axis=1)
    largest = tl.max(high_first, axis=1)
    if TAIL > 0:
        smallest = tl.minimum(smallest, tl.min(low_tail_first, axis=1))
        largest = tl.maximum(largest, tl.max(high_tail_first, axis=1))
    floor_low = _unplaced(smallest, BR) & -(1 << ZERO_BITS)
    largest = _unplaced(largest, BR)
    ceiling_low = tl.full([BR], INT32_MAX, tl.int32)
    if SPLIT_LOW > 0:
        ceiling_low = tl.maximum(group_bound(low_first, BR, GROUPS, SPLIT_LOW, False), floor_low)
    floor_high = tl.full([BR], INT32_MIN, tl.int32)
    if SPLIT_HIGH > 0:
        floor_high = group_bound(high_first, BR, GROUPS, SPLIT_HIGH, True) & -(1 << ZERO_BITS)
    width_low = _width(floor_low, ceiling_low)
    return floor_low, width_low, floor_high, _width(floor_high, largest), largest


@triton.jit
def row_thresholds(keys, mask, tail_keys, tail_mask, x_ptr, first_row, R, C,
                   low_rank, high_rank, BR: tl.constexpr, BC: tl.constexpr,
                   TAIL: tl.constexpr, GROUP: tl.constexpr, TAIL_GROUP: tl.constexpr,
                   SPLIT_LOW: tl.constexpr, SPLIT_HIGH: tl.constexpr,
                   ZERO_BITS: tl.constexpr):  # fmt: skip
    """(low, high, amax_bits, searched_all): each row's values of 0-based ascending ranks
    low_rank and high_rank ([BR] float32), from the rows' keys in registers (`keys` [BR, BC]
    with `mask`, then TAIL more when TAIL > 0, lanes outside the masks holding INT32_MAX), and
    the bits of the row's |x| maximum once clamped to [low, high] ([BR] int32): low and high
    are its least and greatest values, NaN (0x7FFFFFFF) when it holds one.

    The search runs over each group's extreme pairs (GROUP consecutive columns of the head,
    TAIL_GROUP of the tail), bounded as `_bounds` says. It is exact when every key below low
    and every key at or above high is a candidate: the candidates then count the keys outside
    [low, high) as the row does. searched_all (a scalar, 0 or 1) says that a row of the
    program had one outside the candidates, so that the program searched again over every key."""
    by_combine: tl.constexpr = PAIRS_BY_COMBINE
    low_first, low_second = extreme_pairs(keys, BR, BC, GROUP, False, by_combine)
    high_first, high_second = extreme_pairs(
        tl.where(mask, keys, INT32_MIN), BR, BC, GROUP, True, by_combine
    )
    low_tail_first, high_tail_first = low_first, high_first  # no tail: unused
    low_candidates, high_candidates = ((low_first, low_second),), ((high_first, high_second),)
    all_keys, row_keys = ((keys,),), (keys,)
    if TAIL > 0:
        low_tail_first, low_tail_second = extreme_pairs(
            tail_keys, BR, TAIL, TAIL_GROUP, False, by_combine
        )
        high_tail_first, high_tail_second = extreme_pairs(
            tl.where(tail_mask, tail_keys, INT32_MIN), BR, TAIL, TAIL_GROUP, True, by_combine
        )
        low_candidates = ((low_first, low_second), (low_tail_first, low_tail_second))
        high_candidates = ((high_first, high_second), (high_tail_first, high_tail_second))
        all_keys, row_keys = ((keys,), (tail_keys,)), (keys, tail_keys)
    floor_low, width_low, floor_high, width_high, largest = _bounds(
        low_first, high_first, low_tail_first, high_tail_first, BR, BC // GROUP, TAIL,
        SPLIT_LOW, SPLIT_HIGH, ZERO_BITS,
    )  # fmt: skip
    span = tl.reduce(width_low | width_high, 0, _bit_or)
    # the keys at or above the upper rank's trials are among its candidates: the rest lie below
    high_unseen = C - 2 * (BC // GROUP) - 2 * (TAIL // TAIL_GROUP)
    low, high = search_keys(
        low_candidates, high_candidates, x_ptr, first_row, R, C, low_rank, high_rank,
        high_unseen, floor_low, floor_high, width_low, width_high, span, BR, BC, True, ZERO_BITS,
    )  # fmt: skip
    low, high = _unplaced(low, BR), _unplaced(high, BR)
    seen_low, seen_high = _counts_below(
        low_candidates, high_candidates, x_ptr, first_row, R, C, low, high, BR, BC, True
    )
    seen_outside = _unplaced(seen_low, BR) + (C - high_unseen) - _unplaced(seen_high, BR)
    all_outside = _unplaced(_count_outside(row_keys, low, high), BR) - (BC + TAIL - C)
    rows_ok = (first_row + tl.arange(0, BR)) < R
    missed = ((low > high) | (seen_outside != all_outside)) & rows_ok
    searched_all = tl.max(missed.to(tl.int32), axis=0)
    if searched_all != 0:
        low, high = search_keys(
            all_keys, all_keys, x_ptr, first_row, R, C, low_rank, high_rank, 0, floor_low,
            floor_high, width_low, width_high, span, BR, BC, True, ZERO_BITS,
        )  # fmt: skip
        low, high = _unplaced(low, BR), _unplaced(high, BR)
    low, high = key_value(low), key_value(high)
    amax_bits = tl.maximum(abs_bits(low), abs_bits(high))
    amax_bits = tl.where(largest == INT32_MAX, INT32_MAX, amax_bits)
    return low, high, amax_bits, searched_all


@triton.jit
def read_row_thresholds(x_ptr, first_row, R, C, low_rank, high_rank, BR: tl.constexpr,
                        BC: tl.constexpr, ZERO_BITS: tl.constexpr):  # fmt: skip
    """`row_thresholds` of rows too long for registers, read chunk by chunk of BC columns in
    every pass (every bit counted: no bounds)."""
    floor, width = _unbounded(BR)
    # no keys in registers: `search_keys` reads the rows, its key tiles stand unused
    low, high = search_keys(
        ((floor,),), ((floor,),), x_ptr, first_row, R, C, low_rank, high_rank, 0,
        floor, floor, width, width, 0xFFFFFFFF, BR, BC, False, ZERO_BITS,
    )  # fmt: skip
    return key_value(low), key_value(high)
