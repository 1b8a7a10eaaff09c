"""Triton building blocks shared by the quantize and dequantize kernels.

Each function computes, on a register tile, exactly what the reference in `fp4cli.quant`,
`fp4cli.formats` and `fp4cli.techniques.hadamard` computes, with the same float32 operations in
the same order: powers of two are built from their bits, divisions by powers of two are
multiplications by exact reciprocals, and every other division is `tl.div_rn` (correctly
rounded; a plain `/` may be approximate on the GPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.philox import philox_words
from fp4cli.quant.backend import interpreter_on

# The interpreter runs a reduction's combining function in Python, element by element (an RHT
# pair kernel by sums took minutes on the CPU); there the sums over each pair are taken as the
# one addition each of them is. tests/kernels/test_tile_ops.py runs both forms.
SUMS_BY_REDUCE = tl.constexpr(not interpreter_on())

FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def pow2(exponent):
    """2^exponent as float32 for int32 exponents in [-149, 127], exact (subnormals too)."""
    normal = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
    shift = tl.minimum(tl.maximum(exponent + 149, 0), 30)
    subnormal = (tl.full(exponent.shape, 1, tl.int32) << shift).to(tl.float32, bitcast=True)
    return tl.where(exponent >= -126, normal, subnormal)


@triton.jit
def frexp_parts(positive):
    """(floor(log2 x), mantissa bits of x normalized to [1, 2)) for finite x >= 0, exact; the
    result for x == 0 is meaningless and must be masked by the caller."""
    is_subnormal = positive < 1.1754943508222875e-38
    normalized = tl.where(is_subnormal, positive * 16777216.0, positive)  # * 2^24, exact
    bits = normalized.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127 - tl.where(is_subnormal, 24, 0)
    return exponent, bits & 0x7FFFFF


@triton.jit
def e8m0_exponent(
    amax, ELEM_MAX_EXP: tl.constexpr, ELEM_MAX_MANT: tl.constexpr, CEIL: tl.constexpr
):
    """The clamped E8M0 exponent of each block amax (int32): floor(log2 amax) - emax_exp, plus
    one under the ceil rule when amax's mantissa exceeds the element max's (amax > emax * 2^e);
    -127 for an all-zero block."""
    exponent, mantissa = frexp_parts(amax)
    exponent = exponent - ELEM_MAX_EXP
    if CEIL:
        exponent = exponent + (mantissa > ELEM_MAX_MANT).to(tl.int32)
    exponent = tl.where(amax > 0, exponent, -127)
    return tl.minimum(tl.maximum(exponent, -127), 127)


@triton.jit
def round_unsigned_minifloat(
    raw, MBITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_VALUE: tl.constexpr, UP: tl.constexpr,
    ZERO_OK: tl.constexpr,
):  # fmt: skip
    """Round raw >= 0 onto an unsigned minifloat grid (MBITS mantissa bits, smallest normal
    2^MIN_EXP; nearest even, or up), saturating at MAX_VALUE (a grid point) and, unless
    ZERO_OK, at least the smallest subnormal; returns (value, code). All on the float32 bits
    (`_round_minifloat_rne`, `_round_minifloat_up`)."""
    tl.static_assert((MBITS >= 1) & (MBITS <= 22))
    raw = tl.minimum(raw, MAX_VALUE)  # = rounding then saturating: MAX_VALUE is on the grid
    bits = raw.to(tl.int32, bitcast=True)
    if UP:
        value, code = _round_minifloat_up(raw, bits, MBITS, MIN_EXP)
    else:
        value, code = _round_minifloat_rne(raw, bits, MBITS, MIN_EXP)
    if not ZERO_OK:
        value = tl.maximum(value, pow2(tl.full(raw.shape, MIN_EXP - MBITS, tl.int32)))
        code = tl.maximum(code, 1)
    return value, code


@triton.jit
def ties_toward_positive(magnitude, value, code, negative, MBITS: tl.constexpr,
                         MIN_EXP: tl.constexpr):  # fmt: skip
    """`round_unsigned_minifloat`'s nearest-even (value, code) of a magnitude (at most the
    format's largest value) turned to ties toward +inf: at a tie, one grid step up for a
    positive x rounded down, one down for a negative x rounded up (Wang et al.'s E2M1
    thresholds: 5 -> 6, -5 -> -4). The step is the spacing of the magnitude's binade; the
    offset from it is exact."""
    exponent, _ = binade_magic(magnitude.to(tl.int32, bitcast=True), MBITS, MIN_EXP)
    half = (exponent - ((MBITS + 1) << 23)).to(tl.float32, bitcast=True)
    offset = value - magnitude
    # the tie the wrong way: below for a positive x, above for a negative one; the other grid
    # point is value - 2 offset (exact)
    wrong = offset == tl.where(negative, half, -half)
    value = tl.where(wrong, value - 2.0 * offset, value)
    return value, code + tl.where(wrong, tl.where(negative, -1, 1), 0)


@triton.jit
def binade_magic(bits, MBITS: tl.constexpr, MIN_EXP: tl.constexpr):
    """(x's exponent bits, at least 2^MIN_EXP's; M's bits) for the float32 x with these bits:
    M = 1.5 * 2^(k - MBITS + 23), k = max(floor(log2 x), MIN_EXP), whose float32 ulp is the
    spacing of a grid of MBITS mantissa bits in x's binade (its subnormal spacing below
    2^MIN_EXP), so x + M rounds x to that grid, ties to even. From x = 2^(105 + MBITS) up M
    leaves float32's finite range (NaN, then its exponent wraps past the sign bit): callers
    clamp x first or saturate what they derive from it."""
    exponent = tl.maximum(bits & 0x7F800000, (MIN_EXP + 127) << 23)
    return exponent, exponent + (((23 - MBITS) << 23) | 0x400000)


@triton.jit
def _round_minifloat_rne(raw, bits, MBITS: tl.constexpr, MIN_EXP: tl.constexpr):
    """To nearest even, one path for every binade: adding M (`binade_magic`) rounds raw to a
    multiple n of the grid's spacing in its binade (ties to even) in M's binade; (raw + M) - M
    is the value and n + (k - MIN_EXP) * 2^MBITS the code (n counts from 2^MBITS in a normal
    binade). raw is at most MAX_VALUE, and the minimum that made it keeps its product out of
    the addition."""
    exponent, magic = binade_magic(bits, MBITS, MIN_EXP)
    shifted = raw + magic.to(tl.float32, bitcast=True)
    value = shifted - magic.to(tl.float32, bitcast=True)  # exact
    binades = (exponent - ((MIN_EXP + 127) << 23)) >> (23 - MBITS)
    code = shifted.to(tl.int32, bitcast=True) - magic + binades
    return value, code


@triton.jit
def _round_minifloat_up(raw, bits, MBITS: tl.constexpr, MIN_EXP: tl.constexpr):
    """Up: a normal value keeps MBITS of its mantissa bits after adding all of the dropped
    bits' weight less one, so its code is the top exponent and mantissa bits less the bias
    difference; below 2^MIN_EXP adding 1.5 * 2^(MIN_EXP - MBITS + 23), whose float32 ulp is the
    subnormal spacing, rounds to nearest, the sum's low bits count the spacings (the code), and
    one more spacing where that fell below raw."""
    DROP: tl.constexpr = 23 - MBITS
    kept = (bits + ((1 << DROP) - 1)) & -(1 << DROP)
    normal_code = (kept >> DROP) - ((126 + MIN_EXP) << MBITS)
    magic_bits = tl.full(raw.shape, ((MIN_EXP - MBITS + 150) << 23) | 0x400000, tl.int32)
    magic = magic_bits.to(tl.float32, bitcast=True)
    shifted = raw + magic
    low_code = shifted.to(tl.int32, bitcast=True) - magic_bits
    low_code = low_code + ((shifted - magic) < raw).to(tl.int32)
    low_value = low_code.to(tl.float32) * pow2(tl.full(raw.shape, MIN_EXP - MBITS, tl.int32))
    low = raw < pow2(tl.full(raw.shape, MIN_EXP, tl.int32))
    value = tl.where(low, low_value, kept.to(tl.float32, bitcast=True))
    code = tl.where(low, low_code, normal_code)
    return value, code


@triton.jit
def unsigned_minifloat_value(
    code, MBITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_CODE: tl.constexpr
):
    """Float32 value of an unsigned minifloat code (codes above MAX_CODE are NaN), for a format
    whose normal exponents are float32 normal exponents (every minifloat fp4cli has).

    The code's bits are the float32's: shifted onto its mantissa and rebiased,
    `code << (23 - MBITS)` plus (MIN_EXP + 126) << 23. A subnormal code (field 0) is given
    exponent MIN_EXP the same way, 2^MIN_EXP (1 + m / 2^MBITS), less 2^MIN_EXP: exact. No
    int->float conversion."""
    tl.static_assert((MIN_EXP > -126) & ((MAX_CODE >> MBITS) + MIN_EXP <= 128))
    biased = (code << (23 - MBITS)) + ((MIN_EXP + 126) << 23)
    normal = biased.to(tl.float32, bitcast=True)
    raised = (biased + (1 << 23)).to(tl.float32, bitcast=True)
    value = tl.where(code < (1 << MBITS), raised - 2.0**MIN_EXP, normal)
    return tl.where(code > MAX_CODE, float("nan"), value)


@triton.jit
def _e2m1_twice_magic(magnitude):
    """(2|v| + M, M's bits, |v|'s exponent bits raised to 1's) for rounding 2|v| to the E2M1
    grid's doubled spacing: M = 1.5 * 2^(23 + k), k = max(floor(log2 |v|), 0), whose ulp is
    that spacing (1 below 2, 2 in [2, 4), 4 in [4, 8), and so on), so the sum rounds 2|v| to a
    multiple of it, ties to an even multiple, and stays in M's binade. M comes from |v|'s
    exponent bits, unsigned: for |v| in [2^105, 2^106) M is NaN, and from 2^106 (Inf and NaN
    too) its exponent wraps past the sign bit, which leaves M a tiny negative number; the value
    (6 at most) and the code (2k alone is past 7) saturate either way. (2|v|, not |v|: the
    product that made |v| cannot be fused into the addition, and the doubling is exact.)"""
    # |v|'s grid has one mantissa bit from 1 up; 2|v|'s M is one binade above |v|'s
    exponent, magic = binade_magic(magnitude.to(tl.uint32, bitcast=True), 1, 0)
    magic = magic + (1 << 23)
    twice = magnitude * 2.0 + magic.to(tl.float32, bitcast=True)
    return twice, magic, exponent


@triton.jit
def e2m1_code_rne(magnitude):
    """E2M1 magnitude code (0..7) of |v| rounded to nearest, ties to the even code, saturating.

    2|v| + M (`_e2m1_twice_magic`) holds the rounded multiple n of the spacing in its low bits,
    n = bits(2|v| + M) - bits(M) (0..4 below 2, 2..4 above), and the code is n + 2k; codes
    past 7 saturate (Inf and NaN too)."""
    twice, magic, exponent = _e2m1_twice_magic(magnitude)
    steps = twice.to(tl.uint32, bitcast=True) - magic + (exponent >> 22) - 254
    return tl.minimum(steps, 7).to(tl.int32)


@triton.jit
def e2m1_rne_grid(magnitude):
    """`e2m1_value(e2m1_code_rne(magnitude))` without the code, for the dequantized values:
    (2|v| + M) - M is 2|v| rounded to the grid (`_e2m1_twice_magic`), halved; 6 is the largest
    (Inf and NaN give 6 too)."""
    twice, magic, _ = _e2m1_twice_magic(magnitude)
    return tl.minimum((twice - magic.to(tl.float32, bitcast=True)) * 0.5, 6.0)


@triton.jit
def e2m1_sr_grid(magnitude, bits):
    """`e2m1_value(e2m1_code_sr(magnitude, bits))` without the code: the same comparisons of
    the random bits, then the lower grid point plus one step where they round up."""
    random24 = (bits >> 8).to(tl.int32)
    twice = magnitude * 2.0
    floor_twice = tl.floor(twice)
    up_low = random24.to(tl.float32) * 5.9604644775390625e-08 < twice - floor_twice
    low = floor_twice * 0.5 + tl.where(up_low, 0.5, 0.0)
    value_bits = magnitude.to(tl.int32, bitcast=True)
    up_high = random24 < ((value_bits & 0x3FFFFF) << 2)
    high = ((value_bits & -0x400000) + tl.where(up_high, 0x400000, 0)).to(tl.float32, bitcast=True)
    return tl.where(magnitude < 1.0, low, tl.minimum(high, 6.0))


@triton.jit
def e2m1_code_away(magnitude):
    """E2M1 magnitude code (0..7) of |v| rounded to nearest, ties away from zero, saturating.

    Below 1 (grid 0, 0.5, 1) the code counts the midpoints 0.25 and 0.75 that |v| reaches.
    From 1 up, half the weight of the first dropped mantissa bit is added to the bits before
    the bits below one mantissa bit are dropped, so a tie carries up; codes past 7 saturate."""
    low = (magnitude >= 0.25).to(tl.int32) + (magnitude >= 0.75).to(tl.int32)
    bits = magnitude.to(tl.int32, bitcast=True)
    high = tl.minimum(((bits + 0x200000) >> 22) - 252, 7)
    return tl.where(magnitude < 1.0, low, high)


@triton.jit
def e2m1_value(code):
    """Float32 magnitude of an E2M1 magnitude code (0..7), built from its bits: from code 2 up,
    the code is the value's exponent and first mantissa bit, so (code + 252) << 22 is the
    float32 (2 -> 1.0, 3 -> 1.5, ..., 7 -> 6.0); codes 0 and 1 are 0 and 0.5 (0x3F000000).
    `unsigned_minifloat_value`'s E2M1 case, without its NaN codes (none below 8) and with the
    two subnormals as integers: 16.1 SASS instructions a value in the dequantize kernel
    against 17.8 through the general function (sm_90)."""
    code = code.to(tl.int32)
    bits = tl.where(code >= 2, (code + 252) << 22, code * 0x3F000000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def signed(magnitude, negative):
    """float32 `magnitude` (>= 0) with the sign bit set where `negative`: -0.0 for a zero
    magnitude too (a compiled `-x` is 0 - x, which gives +0.0 there; the interpreter's is -0.0)."""
    bits = magnitude.to(tl.int32, bitcast=True)
    return tl.where(negative, bits | -2147483648, bits).to(tl.float32, bitcast=True)


@triton.jit
def signed_e2m1_value(code):
    """Float32 value of a signed E2M1 code (0..15: sign << 3 | magnitude code): `e2m1_value`'s
    bits with the code's sign bit moved to bit 31 (-0.0 for code 8). Not `signed`: moving the
    code's own bit took the dequantize kernel 16.1 SASS instructions a value against 16.9 with
    `signed`'s select (sm_90)."""
    code = code.to(tl.int32)
    magnitude = e2m1_value(code & 7).to(tl.int32, bitcast=True)
    return (magnitude | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e8m0_scale(code):
    """(2^(code - 127) as float32, whether the block is finite: code 255 is NaN)."""
    return pow2(tl.minimum(code, 254) - 127), code != 255


@triton.jit
def e2m1_code_sr(magnitude, bits):
    """E2M1 magnitude code of |v| rounded stochastically with 32 random bits (uint32): up from
    the lower grid point when u = (bits >> 8) / 2^24 < (|v| - lower) / spacing.

    Below 1 that fraction is 2|v| - floor(2|v|); from 1 up it is |v|'s mantissa bits below the
    first, over 2^22, so the test is the integer comparison (bits >> 8) < those bits * 4."""
    random24 = (bits >> 8).to(tl.int32)
    twice = magnitude * 2.0
    floor_twice = tl.floor(twice)
    up_low = random24.to(tl.float32) * 5.9604644775390625e-08 < twice - floor_twice
    low = floor_twice.to(tl.int32) + up_low.to(tl.int32)
    value_bits = magnitude.to(tl.int32, bitcast=True)
    up_high = random24 < ((value_bits & 0x3FFFFF) << 2)
    high = tl.minimum((value_bits >> 22) - 252 + up_high.to(tl.int32), 7)
    return tl.where(magnitude < 1.0, low, high)


@triton.jit
def e2m1_code_guided(magnitude, guide):
    """E2M1 magnitude code of |v| rounded to whichever of the two grid points bracketing it is
    nearer `guide` (Q-EMA; the guide in the same units, on v's side of zero), ties in distance
    to the nearest-even choice, a grid point left where it is, saturating at 6."""
    bits = magnitude.to(tl.int32, bitcast=True)
    below_one = tl.floor(magnitude * 2.0).to(tl.int32)
    lower = tl.where(magnitude < 1.0, below_one, tl.minimum((bits >> 22) - 252, 7))
    lower_value = e2m1_value(lower)
    dist_lo = tl.abs(guide - lower_value)
    dist_hi = tl.abs(guide - e2m1_value(tl.minimum(lower + 1, 7)))
    nearest_up = e2m1_code_rne(magnitude) > lower
    up = tl.where(dist_hi == dist_lo, nearest_up, dist_hi < dist_lo) & (magnitude > lower_value)
    return tl.minimum(lower + up.to(tl.int32), 7)


@triton.jit
def word_of(w0, w1, w2, w3, lane):
    return tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))


@triton.jit
def random_bits_at(seed, index):
    """The stochastic-rounding bits (uint32) of each int64 element index: word (index mod 4)
    of Philox for counter index // 4 (one call per element; for any index pattern)."""
    w0, w1, w2, w3 = philox_words(seed, index >> 2)
    return word_of(w0, w1, w2, w3, (index & 3).to(tl.int32))


@triton.jit
def random_bits_rows(seed, first_index, row_stride, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Random bits (uint32) for the tile index[r, c] = first_index + r * row_stride + c (int64),
    one Philox call per four elements. Needs first_index and row_stride divisible by 4."""
    rows = tl.arange(0, ROWS).to(tl.int64)[:, None]
    groups = tl.arange(0, COLS // 4).to(tl.int64)[None, :]
    counters = (first_index + rows * row_stride) // 4 + groups
    w0, w1, w2, w3 = philox_words(seed, counters)
    words = tl.join(tl.join(w0, w2), tl.join(w1, w3))  # [r, g, i, j] holds word 2 i + j
    return tl.reshape(words, (ROWS, COLS))


@triton.jit
def negated_positions(seed, SIZE: tl.constexpr, SIGNS: tl.constexpr = -1):
    """[1, SIZE] uint32: 1 where position j of the transform is negated, else 0. SIGNS -1: the
    top bit of the random bits at offset j (one Philox call per four); otherwise bit j of the
    fixed mask SIGNS (`hadamard.FixedSigns`, SIZE <= 32)."""
    if SIGNS < 0:
        return random_bits_rows(seed, 0, 0, 1, SIZE) >> 31  # offsets 0 .. SIZE - 1
    positions = tl.arange(0, SIZE).to(tl.int64)[None, :]
    return ((tl.full((1, SIZE), SIGNS, tl.int64) >> positions) & 1).to(tl.uint32)


@triton.jit
def hadamard_signs(
    seed, COLS: tl.constexpr, SIZE: tl.constexpr, SIGNS: tl.constexpr = -1,
    ONE_WORD: tl.constexpr = False,
):  # fmt: skip
    """+-1 for each column of a tile (COLS a multiple of SIZE): the sign of position (column
    mod SIZE) in the transform (`negated_positions`), the SIZE signs found once and repeated
    across the tile. ONE_WORD (SIZE <= 32): drawn signs packed into one word that every thread
    reads, for tiles whose threads each hold a whole transform (`tile_io.runs_by_thread`)."""
    negated = negated_positions(seed, SIZE, SIGNS)
    if ONE_WORD and SIGNS < 0:
        positions = tl.arange(0, SIZE)[None, :]
        mask = tl.sum(negated << positions.to(tl.uint32))
        negated = (mask >> positions.to(tl.uint32)) & 1
    signs = 1.0 - 2.0 * negated.to(tl.float32)
    return tl.reshape(tl.broadcast_to(signs, (COLS // SIZE, SIZE)), (COLS,))


@triton.jit
def add(a, b):
    """a + b, as a reduction's combining function."""
    return a + b


@triton.jit
def butterfly_by_sums(pairs):
    """(a, b) -> (a + b, a - b) along the middle axis (size 2) of [N, 2, H], as two sums over
    that axis: a + b, and a + (-b), which is a - b exactly. Reduced with `add`, not `tl.sum`,
    whose interpreter starts from +0.0 (-0.0 + -0.0 came out +0.0)."""
    pair_sign = 1.0 - 2.0 * tl.arange(0, 2).to(tl.float32)
    if SUMS_BY_REDUCE:
        total = tl.reduce(pairs, 1, add)
        difference = tl.reduce(pairs * pair_sign[None, :, None], 1, add)
    else:  # the same additions: a + b, and a + (-b)
        a, b = tl.split(tl.permute(pairs, (0, 2, 1)))
        total = a + b
        difference = a + b * -1.0
    first = (tl.arange(0, 2) == 0)[None, :, None]
    return tl.where(first, tl.expand_dims(total, 1), tl.expand_dims(difference, 1))


@triton.jit
def hadamard_rows(
    x,
    seed,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    SIZE: tl.constexpr,
    LOG2_SIZE: tl.constexpr,
    NORM: tl.constexpr,
    BY_SUMS: tl.constexpr = False,
    SIGNS: tl.constexpr = -1,
    ONE_WORD: tl.constexpr = False,
):
    """The random Hadamard transform of each SIZE-block along the last axis of a float32 tile:
    signs, the butterfly stages h = 1, 2, .., SIZE/2 ((a, b) -> (a + b, a - b)), then * NORM.

    Two ways to the same values: the pairs split out and joined back (the compiler moves them
    through shared memory where they lie in different threads), or, BY_SUMS, each pair's sum
    and difference as sums over the pair (`butterfly_by_sums`: warp shuffles, and the tile
    keeps the layout it was loaded in). Which is faster depends on the kernel: sums for the
    row kernel's packed codes, the split for its values, the amax pass and the pair kernel
    (docs/benchmarks.md, "The Hadamard butterflies as sums, for packed codes"). SIGNS: as
    `hadamard_signs` takes them (0: none, no multiplication), and ONE_WORD."""
    if SIGNS != 0:
        x = x * hadamard_signs(seed, COLS, SIZE, SIGNS, ONE_WORD)[None, :]
    for stage in tl.static_range(LOG2_SIZE):
        pairs = tl.reshape(x, (ROWS * COLS // (2 << stage), 2, 1 << stage))
        if BY_SUMS:
            pairs = butterfly_by_sums(pairs)
        else:
            a, b = tl.split(tl.permute(pairs, (0, 2, 1)))
            pairs = tl.permute(tl.join(a + b, a - b), (0, 2, 1))
        x = tl.reshape(pairs, (ROWS, COLS))
    return x * NORM


@triton.jit
def hadamard_cols(
    x,
    seed,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    SIZE: tl.constexpr,
    LOG2_SIZE: tl.constexpr,
    NORM: tl.constexpr,
    SIGNS: tl.constexpr = -1,
):
    """`hadamard_rows` along the first axis: the transform of each SIZE-block of every column,
    the same operations in the same order (signs by row, butterflies between rows h apart)."""
    if SIGNS != 0:
        x = x * hadamard_signs(seed, ROWS, SIZE, SIGNS)[:, None]
    for stage in tl.static_range(LOG2_SIZE):
        pairs = tl.reshape(x, (ROWS // (2 << stage), 2, (1 << stage) * COLS))
        a, b = tl.split(tl.permute(pairs, (0, 2, 1)))
        x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), (ROWS, COLS))
    return x * NORM


@triton.jit
def square_reduce(per_block, ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_AXIS: tl.constexpr, SUM: tl.constexpr):  # fmt: skip
    """Per-block values of a tile ([ROWS, COLS / BLOCK] for blocks along its rows, BLOCK_AXIS 1;
    [ROWS / BLOCK, COLS] down its columns, 0) replaced by their largest (SUM: their sum) over
    each BLOCK x BLOCK square of the tile, for 2-D tiles."""
    if BLOCK_AXIS == 1:  # runs of BLOCK rows
        runs = tl.reshape(per_block, (ROWS // BLOCK, BLOCK, COLS // BLOCK))
        squares = tl.max(runs, axis=1)
        if SUM:  # (the unused max is dropped by the compiler)
            squares = tl.sum(runs, axis=1)
        spread = tl.broadcast_to(tl.expand_dims(squares, 1), (ROWS // BLOCK, BLOCK, COLS // BLOCK))
        result = tl.reshape(spread, (ROWS, COLS // BLOCK))
    else:
        runs = tl.reshape(per_block, (ROWS // BLOCK, COLS // BLOCK, BLOCK))
        squares = tl.max(runs, axis=2)
        if SUM:  # (the unused max is dropped by the compiler)
            squares = tl.sum(runs, axis=2)
        spread = tl.broadcast_to(tl.expand_dims(squares, 2), (ROWS // BLOCK, COLS // BLOCK, BLOCK))
        result = tl.reshape(spread, (ROWS // BLOCK, COLS))
    return result


@triton.jit
def outer_reduce(
    per_block, ROWS: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr, OUTER: tl.constexpr,
    BLOCK_AXIS: tl.constexpr, SUM: tl.constexpr = False,
):  # fmt: skip
    """Per-block values of a tile (`square_reduce`'s shapes) replaced by their largest (SUM:
    their sum) over each run of OUTER blocks along the blocks' axis (an outer block, or an
    MS-EDEN group; the tile's extent along that axis is a multiple of OUTER * BLOCK)."""
    if BLOCK_AXIS == 1:
        runs = tl.reshape(per_block, (ROWS, COLS // (BLOCK * OUTER), OUTER))
        reduced = tl.sum(runs, axis=2) if SUM else tl.max(runs, axis=2)
        spread = tl.broadcast_to(tl.expand_dims(reduced, 2), runs.shape)
        result = tl.reshape(spread, (ROWS, COLS // BLOCK))
    else:
        runs = tl.reshape(per_block, (ROWS // (BLOCK * OUTER), OUTER, COLS))
        reduced = tl.sum(runs, axis=1) if SUM else tl.max(runs, axis=1)
        spread = tl.broadcast_to(tl.expand_dims(reduced, 1), runs.shape)
        result = tl.reshape(spread, (ROWS // BLOCK, COLS))
    return result
