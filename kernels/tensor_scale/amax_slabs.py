"""Tensor amax passes whose Hadamard butterflies move nothing between threads.

A transform's butterfly stage pairs positions h apart inside each block. When the tile is
loaded as one tensor per block position ("slabs"), every stage adds and subtracts whole
tensors element by element, in registers, where a transform of one tile tensor
(`tile_ops.hadamard_rows` / `hadamard_cols`) exchanges values between threads at its wider
stages. Each element still takes the reference's operations in its order (the sign, the stages
h = 1, 2, 4, .., then the normalization), so the amax has the same bits.

- `amax_rht16_cols_kernel`: the commonest pair of NVIDIA's recipe (no transform along the rows,
  a 16-point transform down the columns, for the weight-gradient GEMM). Slab j holds rows
  16 g + j of the tile (g < G).
- `amax_both_kernel`: a transform of one size along the rows and down the columns:
  ue5m3-hadamard-sr's pairs (32 points), UFP4's (16). Down the columns, slab j holds rows
  SIZE g + j of the tile; along the rows, SIZE / 8 loads of 8 consecutive columns per block
  (vector loads, the second read of the tile mostly from L1), split in registers into the
  block's positions.

Three facts make the maxima cheaper than the transformed values:

- The normalization is one multiplication after the maximum: rounding is monotonic, so the
  largest |s * NORM| is the largest |s| times NORM, rounded once.
- The last stage's pair (u + v, u - v) has max(|u + v|, |u - v|) = |u| + |v|, each rounded
  (the larger of the two is the sum of the magnitudes, by symmetry and monotonicity).
- A float maximum leaves NaN out (it returns the other operand; the maxima start at 0). Only
  an Inf needs the finite filter, so a program whose maxima come out Inf reads its tiles again
  with the filter, and with both outputs of the last stage (a sum of magnitudes that
  overflows can hide a finite difference).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tensor_scale.amax import finite_magnitude, store_partial
from fp4cli.kernels.tensor_scale.encode_table import last_program_tables
from fp4cli.kernels.tiles.tile_io import rounded_to_bf16, seed_of
from fp4cli.kernels.tiles.tile_ops import FLOAT32_MAX, negated_positions


@triton.jit
def sign_flips(seed, SIZE: tl.constexpr, SIGNS: tl.constexpr = -1):
    """The transform's SIZE signs as a bit mask (uint32): bit j set where position j is
    negated (`tile_ops.negated_positions`: drawn from the seed, or the fixed SIGNS)."""
    flips = negated_positions(seed, SIZE, SIGNS) << tl.arange(0, SIZE).to(tl.uint32)[None, :]
    return tl.sum(tl.sum(flips, axis=1), axis=0)


@triton.jit
def signed(values, flips, J: tl.constexpr):
    """float32 values times position J's sign: the sign bit flipped where the mask's bit J is
    set (exact, as a multiplication by -1 is)."""
    flip = ((flips >> J) & 1) << 31
    return (values.to(tl.uint32, bitcast=True) ^ flip).to(tl.float32, bitcast=True)


@triton.jit
def butterfly4(a0, a1, a2, a3):
    """Stages h = 1, 2 of a 4-point block."""
    a0, a1 = a0 + a1, a0 - a1
    a2, a3 = a2 + a3, a2 - a3
    return a0 + a2, a1 + a3, a0 - a2, a1 - a3


@triton.jit
def butterfly8(a0, a1, a2, a3, a4, a5, a6, a7):
    """Stages h = 1, 2, 4 of an 8-point block."""
    a0, a1, a2, a3 = butterfly4(a0, a1, a2, a3)
    a4, a5, a6, a7 = butterfly4(a4, a5, a6, a7)
    return a0 + a4, a1 + a5, a2 + a6, a3 + a7, a0 - a4, a1 - a5, a2 - a6, a3 - a7


@triton.jit
def butterfly16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    """Stages h = 1, .., 8 of a 16-point block."""
    a0, a1, a2, a3, a4, a5, a6, a7 = butterfly8(a0, a1, a2, a3, a4, a5, a6, a7)
    a8, a9, a10, a11, a12, a13, a14, a15 = butterfly8(a8, a9, a10, a11, a12, a13, a14, a15)
    return (a0 + a8, a1 + a9, a2 + a10, a3 + a11, a4 + a12, a5 + a13, a6 + a14, a7 + a15,
            a0 - a8, a1 - a9, a2 - a10, a3 - a11, a4 - a12, a5 - a13, a6 - a14,
            a7 - a15)  # fmt: skip


@triton.jit
def last_stage_max(u, v, FINITE: tl.constexpr):
    """The larger |output| of the last stage's pair (u + v, u - v): |u| + |v|, or with FINITE
    each output's finite magnitude (NaN and Inf as 0)."""
    if FINITE:
        return tl.maximum(finite_magnitude(u + v), finite_magnitude(u - v))
    return tl.abs(u) + tl.abs(v)


@triton.jit
def _half_max(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
              FINITE: tl.constexpr):  # fmt: skip
    """The largest last-stage output over the pairs (a_i, b_i)."""
    return tl.maximum(
        tl.maximum(
            tl.maximum(last_stage_max(a0, b0, FINITE), last_stage_max(a1, b1, FINITE)),
            tl.maximum(last_stage_max(a2, b2, FINITE), last_stage_max(a3, b3, FINITE)),
        ),
        tl.maximum(
            tl.maximum(last_stage_max(a4, b4, FINITE), last_stage_max(a5, b5, FINITE)),
            tl.maximum(last_stage_max(a6, b6, FINITE), last_stage_max(a7, b7, FINITE)),
        ),
    )


@triton.jit
def butterfly16_max(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
                    FINITE: tl.constexpr):  # fmt: skip
    """The largest |output| (before the normalization) of the 16-point butterfly of signed
    positions a0 .. a7, b0 .. b7, element by element."""
    a0, a1, a2, a3, a4, a5, a6, a7 = butterfly8(a0, a1, a2, a3, a4, a5, a6, a7)
    b0, b1, b2, b3, b4, b5, b6, b7 = butterfly8(b0, b1, b2, b3, b4, b5, b6, b7)
    return _half_max(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7, FINITE)


@triton.jit
def butterfly32_max(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
                    b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15,
                    FINITE: tl.constexpr):  # fmt: skip
    """The largest |output| (before the normalization) of the 32-point butterfly of signed
    positions a0 .. a15, b0 .. b15, element by element."""
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = butterfly16(
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15
    )
    b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = butterfly16(
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15
    )
    return tl.maximum(
        _half_max(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7, FINITE),
        _half_max(a8, a9, a10, a11, a12, a13, a14, a15,
                  b8, b9, b10, b11, b12, b13, b14, b15, FINITE),
    )  # fmt: skip


@triton.jit
def _slab(x_ptr, row0, col0, rows, cols, flips, J: tl.constexpr, SIZE: tl.constexpr,
          G: tl.constexpr, BC: tl.constexpr, ROUND_BF16: tl.constexpr,
          EVEN: tl.constexpr):  # fmt: skip
    """(slab J of the tile down the columns: rows row0 + SIZE g + J (g < G), columns col0 ..
    col0 + BC, zero outside x; the slab signed for the SIZE-point transform). ROUND_BF16: a
    float32 x read as its bfloat16 rounding. EVEN: every tile lies inside x (no masks)."""
    lines = row0 + SIZE * tl.arange(0, G).to(tl.int64) + J
    positions = col0 + tl.arange(0, BC)
    pointers = x_ptr + lines[:, None] * cols + positions[None, :]
    if EVEN:
        slab = tl.load(pointers).to(tl.float32)
    else:
        mask = (lines < rows)[:, None] & (positions < cols)[None, :]
        slab = tl.load(pointers, mask=mask, other=0.0).to(tl.float32)
    if ROUND_BF16:
        slab = rounded_to_bf16(slab)
    return slab, signed(slab, flips, J)


@triton.jit
def _cols_max(x_ptr, row0, col0, rows, cols, flips, G: tl.constexpr, BC: tl.constexpr,
              FINITE: tl.constexpr, ROUND_BF16: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """[G, BC]: the largest |transformed value| (before the normalization) of each column's
    32-block at each slab position."""
    return butterfly32_max(
        _slab(x_ptr, row0, col0, rows, cols, flips, 0, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 1, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 2, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 3, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 4, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 5, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 6, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 7, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 8, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 9, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 10, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 11, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 12, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 13, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 14, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 15, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 16, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 17, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 18, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 19, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 20, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 21, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 22, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 23, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 24, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 25, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 26, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 27, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 28, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 29, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 30, 32, G, BC, ROUND_BF16, EVEN)[1],
        _slab(x_ptr, row0, col0, rows, cols, flips, 31, 32, G, BC, ROUND_BF16, EVEN)[1],
        FINITE,
    )


@triton.jit
def _largest(a, b, c, d):
    return tl.maximum(tl.maximum(a, b), tl.maximum(c, d))


@triton.jit
def _magnitude(values, FINITE: tl.constexpr):
    """|values|, with NaN and Inf as 0 when FINITE (else as they are: a float max leaves NaN
    out, and the caller checks the result for Inf)."""
    if FINITE:
        return finite_magnitude(values)
    return tl.abs(values)


@triton.jit
def _plain_max(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
               FINITE: tl.constexpr):  # fmt: skip
    """The largest |value| of 16 slabs, element by element."""
    return tl.maximum(
        tl.maximum(
            _largest(_magnitude(r0, FINITE), _magnitude(r1, FINITE),
                     _magnitude(r2, FINITE), _magnitude(r3, FINITE)),
            _largest(_magnitude(r4, FINITE), _magnitude(r5, FINITE),
                     _magnitude(r6, FINITE), _magnitude(r7, FINITE)),
        ),
        tl.maximum(
            _largest(_magnitude(r8, FINITE), _magnitude(r9, FINITE),
                     _magnitude(r10, FINITE), _magnitude(r11, FINITE)),
            _largest(_magnitude(r12, FINITE), _magnitude(r13, FINITE),
                     _magnitude(r14, FINITE), _magnitude(r15, FINITE)),
        ),
    )  # fmt: skip


@triton.jit
def _rht16_slab_maxima(x_ptr, row0, col0, rows, cols, flips, G: tl.constexpr, BC: tl.constexpr,
                       FINITE: tl.constexpr, ROUND_BF16: tl.constexpr,
                       EVEN: tl.constexpr):  # fmt: skip
    """(largest |x|, largest |transformed x| before the normalization) at each of the [G, BC]
    positions of the tile's 16 slabs (rows row0 + 16 g + j, columns col0 + c)."""
    r0, s0 = _slab(x_ptr, row0, col0, rows, cols, flips, 0, 16, G, BC, ROUND_BF16, EVEN)
    r1, s1 = _slab(x_ptr, row0, col0, rows, cols, flips, 1, 16, G, BC, ROUND_BF16, EVEN)
    r2, s2 = _slab(x_ptr, row0, col0, rows, cols, flips, 2, 16, G, BC, ROUND_BF16, EVEN)
    r3, s3 = _slab(x_ptr, row0, col0, rows, cols, flips, 3, 16, G, BC, ROUND_BF16, EVEN)
    r4, s4 = _slab(x_ptr, row0, col0, rows, cols, flips, 4, 16, G, BC, ROUND_BF16, EVEN)
    r5, s5 = _slab(x_ptr, row0, col0, rows, cols, flips, 5, 16, G, BC, ROUND_BF16, EVEN)
    r6, s6 = _slab(x_ptr, row0, col0, rows, cols, flips, 6, 16, G, BC, ROUND_BF16, EVEN)
    r7, s7 = _slab(x_ptr, row0, col0, rows, cols, flips, 7, 16, G, BC, ROUND_BF16, EVEN)
    r8, s8 = _slab(x_ptr, row0, col0, rows, cols, flips, 8, 16, G, BC, ROUND_BF16, EVEN)
    r9, s9 = _slab(x_ptr, row0, col0, rows, cols, flips, 9, 16, G, BC, ROUND_BF16, EVEN)
    r10, s10 = _slab(x_ptr, row0, col0, rows, cols, flips, 10, 16, G, BC, ROUND_BF16, EVEN)
    r11, s11 = _slab(x_ptr, row0, col0, rows, cols, flips, 11, 16, G, BC, ROUND_BF16, EVEN)
    r12, s12 = _slab(x_ptr, row0, col0, rows, cols, flips, 12, 16, G, BC, ROUND_BF16, EVEN)
    r13, s13 = _slab(x_ptr, row0, col0, rows, cols, flips, 13, 16, G, BC, ROUND_BF16, EVEN)
    r14, s14 = _slab(x_ptr, row0, col0, rows, cols, flips, 14, 16, G, BC, ROUND_BF16, EVEN)
    r15, s15 = _slab(x_ptr, row0, col0, rows, cols, flips, 15, 16, G, BC, ROUND_BF16, EVEN)
    plain = _plain_max(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
                       FINITE)  # fmt: skip
    transformed = butterfly16_max(s0, s1, s2, s3, s4, s5, s6, s7,
                                  s8, s9, s10, s11, s12, s13, s14, s15, FINITE)  # fmt: skip
    return plain, transformed


@triton.jit
def _program_maxima16(x_ptr, rows, cols, tiles, tiles_c, flips, G: tl.constexpr,
                      BC: tl.constexpr, FINITE: tl.constexpr,
                      ROUND_BF16: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """(largest |x|, largest |transformed x| before the normalization) over this program's
    tiles of `amax_rht16_cols_kernel`."""
    plain = tl.zeros((G, BC), tl.float32)
    transformed = tl.zeros((G, BC), tl.float32)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        row0 = ((tile // tiles_c) * 16 * G).to(tl.int64)
        col0 = ((tile % tiles_c) * BC).to(tl.int64)
        tile_plain, tile_transformed = _rht16_slab_maxima(
            x_ptr, row0, col0, rows, cols, flips, G, BC, FINITE, ROUND_BF16, EVEN
        )
        plain = tl.maximum(plain, tile_plain)
        transformed = tl.maximum(transformed, tile_transformed)
    return (tl.max(tl.max(plain, axis=1), axis=0),
            tl.max(tl.max(transformed, axis=1), axis=0))  # fmt: skip


@triton.jit(do_not_specialize=["rht_seed_value"])
def amax_rht16_cols_kernel(
    x_ptr, amax_ptr, rht_seed_ptr, rht_seed_value, rows, cols, tiles, tiles_c,
    G: tl.constexpr, BC: tl.constexpr, PLAIN: tl.constexpr, RHT_SEED_FROM_PTR: tl.constexpr,
    NORM: tl.constexpr, SIGNS: tl.constexpr, ROUND_BF16: tl.constexpr = False,
    EVEN: tl.constexpr = False,
    TABLES: tl.constexpr = 0, SCALE_MBITS: tl.constexpr = 0, SCALE_MIN_EXP: tl.constexpr = 0,
    SCALE_MAX_CODE: tl.constexpr = 0, TWO_LEVEL_TARGET: tl.constexpr = 0.0,
    ELEM_INV: tl.constexpr = 0.0,
):  # fmt: skip
    """Direction 1: the largest finite |value| of x (rows, cols) after the 16-point random
    Hadamard transform down its columns (rows padded with zeros to a multiple of 16); with
    PLAIN, direction 0: the largest finite |x| (else 0). Tile t holds rows [16 G (t // tiles_c),
    16 G (t // tiles_c + 1)) of columns [BC (t % tiles_c), ..); program p reads tiles p,
    p + programs, .. and writes its maxima into the partial maxima at amax_ptr
    (`amax.store_partial`). ROUND_BF16: a float32 x read as its bfloat16 rounding. EVEN: the
    tiles cover x exactly (loads without masks). TABLES and the table constants:
    `encode_table.last_program_tables`."""
    flips = sign_flips(seed_of(rht_seed_ptr, rht_seed_value, RHT_SEED_FROM_PTR), 16, SIGNS)
    plain, transformed = _program_maxima16(x_ptr, rows, cols, tiles, tiles_c, flips, G, BC,
                                           False, ROUND_BF16, EVEN)  # fmt: skip
    if not ((plain <= FLOAT32_MAX) & (transformed <= FLOAT32_MAX)):  # an Inf (or a kept NaN)
        plain, transformed = _program_maxima16(x_ptr, rows, cols, tiles, tiles_c, flips, G, BC,
                                               True, ROUND_BF16, EVEN)  # fmt: skip
    if not PLAIN:
        plain = 0.0
    store_partial(amax_ptr, 0, plain)
    store_partial(amax_ptr, 1, transformed * NORM)
    last_program_tables(amax_ptr, TABLES, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX_CODE,
                        TWO_LEVEL_TARGET, ELEM_INV)  # fmt: skip


@triton.jit
def _eight(x_ptr, row0, col0, rows, cols, flips, Q: tl.constexpr, R: tl.constexpr,
           BC: tl.constexpr, ROUND_BF16: tl.constexpr, EVEN: tl.constexpr,
           SIZE: tl.constexpr = 32):  # fmt: skip
    """Positions 8 Q .. 8 Q + 7 of each row's SIZE-blocks in the tile (rows row0 .. row0 + R,
    columns col0 .. col0 + BC), each an [R, BC / SIZE] tensor, signed: one vector load of 8
    columns, split in registers."""
    lines = row0 + tl.arange(0, R).to(tl.int64)
    blocks = col0 + SIZE * tl.arange(0, BC // SIZE) + 8 * Q
    positions = blocks[:, None] + tl.arange(0, 8)[None, :]
    pointers = x_ptr + lines[:, None, None] * cols + positions[None, :, :]
    if EVEN:
        chunk = tl.load(pointers).to(tl.float32)
    else:
        mask = (lines < rows)[:, None, None] & (positions < cols)[None, :, :]
        chunk = tl.load(pointers, mask=mask, other=0.0).to(tl.float32)
    if ROUND_BF16:
        chunk = rounded_to_bf16(chunk)
    even, odd = tl.split(tl.reshape(chunk, (R, BC // SIZE, 4, 2)))  # 0, 2, 4, 6; 1, 3, 5, 7
    e04, e26 = tl.split(tl.reshape(even, (R, BC // SIZE, 2, 2)))
    o15, o37 = tl.split(tl.reshape(odd, (R, BC // SIZE, 2, 2)))
    e0, e4 = tl.split(e04)
    e2, e6 = tl.split(e26)
    e1, e5 = tl.split(o15)
    e3, e7 = tl.split(o37)
    return (signed(e0, flips, 8 * Q), signed(e1, flips, 8 * Q + 1),
            signed(e2, flips, 8 * Q + 2), signed(e3, flips, 8 * Q + 3),
            signed(e4, flips, 8 * Q + 4), signed(e5, flips, 8 * Q + 5),
            signed(e6, flips, 8 * Q + 6), signed(e7, flips, 8 * Q + 7))  # fmt: skip


@triton.jit
def _rows_max(x_ptr, row0, col0, rows, cols, flips, R: tl.constexpr, BC: tl.constexpr,
              FINITE: tl.constexpr, ROUND_BF16: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """[R, BC / 32]: the largest |transformed value| (before the normalization) of each row's
    32-blocks in the tile."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _eight(x_ptr, row0, col0, rows, cols, flips, 0, R, BC,
                                            ROUND_BF16, EVEN)  # fmt: skip
    a8, a9, a10, a11, a12, a13, a14, a15 = _eight(x_ptr, row0, col0, rows, cols, flips, 1, R,
                                                  BC, ROUND_BF16, EVEN)  # fmt: skip
    b0, b1, b2, b3, b4, b5, b6, b7 = _eight(x_ptr, row0, col0, rows, cols, flips, 2, R, BC,
                                            ROUND_BF16, EVEN)  # fmt: skip
    b8, b9, b10, b11, b12, b13, b14, b15 = _eight(x_ptr, row0, col0, rows, cols, flips, 3, R,
                                                  BC, ROUND_BF16, EVEN)  # fmt: skip
    return butterfly32_max(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
                           b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15,
                           FINITE)  # fmt: skip


@triton.jit
def _rows_max16(x_ptr, row0, col0, rows, cols, flips, R: tl.constexpr, BC: tl.constexpr,
                FINITE: tl.constexpr, ROUND_BF16: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """[R, BC / 16]: the largest |transformed value| (before the normalization) of each row's
    16-blocks in the tile."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _eight(x_ptr, row0, col0, rows, cols, flips, 0, R, BC,
                                            ROUND_BF16, EVEN, 16)  # fmt: skip
    b0, b1, b2, b3, b4, b5, b6, b7 = _eight(x_ptr, row0, col0, rows, cols, flips, 1, R, BC,
                                            ROUND_BF16, EVEN, 16)  # fmt: skip
    return butterfly16_max(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7, FINITE)


@triton.jit
def _program_maxima_both(x_ptr, rows, cols, tiles, tiles_c, row_flips, col_flips,
                         SIZE: tl.constexpr, G: tl.constexpr, BC: tl.constexpr,
                         FINITE: tl.constexpr, ROUND_BF16: tl.constexpr,
                         EVEN: tl.constexpr):  # fmt: skip
    """(row direction's, column direction's) largest |transformed value| before the
    normalization over this program's tiles of `amax_both_kernel`."""
    row_max = tl.zeros((SIZE * G, BC // SIZE), tl.float32)
    col_max = tl.zeros((G, BC), tl.float32)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        row0 = ((tile // tiles_c) * SIZE * G).to(tl.int64)
        col0 = ((tile % tiles_c) * BC).to(tl.int64)
        if SIZE == 32:
            tile_cols = _cols_max(x_ptr, row0, col0, rows, cols, col_flips, G, BC, FINITE,
                                  ROUND_BF16, EVEN)  # fmt: skip
            tile_rows = _rows_max(x_ptr, row0, col0, rows, cols, row_flips, SIZE * G, BC,
                                  FINITE, ROUND_BF16, EVEN)  # fmt: skip
        else:
            tile_cols = _rht16_slab_maxima(x_ptr, row0, col0, rows, cols, col_flips, G, BC,
                                           FINITE, ROUND_BF16, EVEN)[1]  # fmt: skip
            tile_rows = _rows_max16(x_ptr, row0, col0, rows, cols, row_flips, SIZE * G, BC,
                                    FINITE, ROUND_BF16, EVEN)  # fmt: skip
        col_max = tl.maximum(col_max, tile_cols)
        row_max = tl.maximum(row_max, tile_rows)
    return tl.max(tl.max(row_max, axis=1), axis=0), tl.max(tl.max(col_max, axis=1), axis=0)


@triton.jit(do_not_specialize=["row_seed_value", "col_seed_value"])
def amax_both_kernel(
    x_ptr, amax_ptr, row_seed_ptr, row_seed_value, col_seed_ptr, col_seed_value,
    rows, cols, tiles, tiles_c,
    SIZE: tl.constexpr, G: tl.constexpr, BC: tl.constexpr, NORM: tl.constexpr,
    ROW_SEED_FROM_PTR: tl.constexpr, COL_SEED_FROM_PTR: tl.constexpr,
    ROW_SIGNS: tl.constexpr, COL_SIGNS: tl.constexpr, ROUND_BF16: tl.constexpr = False,
    EVEN: tl.constexpr = False,
    TABLES: tl.constexpr = 0, SCALE_MBITS: tl.constexpr = 0, SCALE_MIN_EXP: tl.constexpr = 0,
    SCALE_MAX_CODE: tl.constexpr = 0, TWO_LEVEL_TARGET: tl.constexpr = 0.0,
    ELEM_INV: tl.constexpr = 0.0,
):  # fmt: skip
    """Directions 0 and 1: the largest finite |value| of x (rows, cols) after the SIZE-point
    (16 or 32) random Hadamard transform along its rows and after the one down its columns
    (each padded with zeros to a multiple of SIZE). Tile t holds rows [SIZE G (t // tiles_c),
    SIZE G (t // tiles_c + 1)) of columns [BC (t % tiles_c), ..); program p reads tiles p,
    p + programs, .. and writes its maxima into the partial maxima at amax_ptr
    (`amax.store_partial`). ROUND_BF16: a float32 x read as its bfloat16 rounding. EVEN: the
    tiles cover x exactly (loads without masks). TABLES and the table constants:
    `encode_table.last_program_tables`."""
    row_flips = sign_flips(seed_of(row_seed_ptr, row_seed_value, ROW_SEED_FROM_PTR), SIZE,
                           ROW_SIGNS)  # fmt: skip
    col_flips = sign_flips(seed_of(col_seed_ptr, col_seed_value, COL_SEED_FROM_PTR), SIZE,
                           COL_SIGNS)  # fmt: skip
    row_max, col_max = _program_maxima_both(x_ptr, rows, cols, tiles, tiles_c, row_flips,
                                            col_flips, SIZE, G, BC, False, ROUND_BF16,
                                            EVEN)  # fmt: skip
    if not ((row_max <= FLOAT32_MAX) & (col_max <= FLOAT32_MAX)):  # an Inf (or a kept NaN)
        row_max, col_max = _program_maxima_both(x_ptr, rows, cols, tiles, tiles_c, row_flips,
                                                col_flips, SIZE, G, BC, True, ROUND_BF16,
                                                EVEN)  # fmt: skip
    store_partial(amax_ptr, 0, row_max * NORM)
    store_partial(amax_ptr, 1, col_max * NORM)
    last_program_tables(amax_ptr, TABLES, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX_CODE,
                        TWO_LEVEL_TARGET, ELEM_INV)  # fmt: skip
