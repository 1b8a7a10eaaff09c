"""The tensor amax a two-level (NVFP4-style) spec scales by, from one read of a 2-D tensor.

`amax_pair_kernel` loads [BR, BC] tiles and reduces each direction's largest finite |value|:
of the tile, or of its Hadamard transform along that direction's axis (`hadamard_rows`,
`hadamard_cols`). Its transform down the columns moves values between threads at every
butterfly stage.

`amax_rht16_cols_kernel` takes the commonest pair of NVIDIA's recipe (no transform along the
rows, a 16-point transform down the columns, for the weight-gradient GEMM) without moving
anything: a program loads 16 "slabs", slab j holding rows 16 g + j of its tile (g < G), so each
butterfly stage adds and subtracts whole slabs element by element. Every element takes the
operations `hadamard_cols` applies to it, in the same order (sign, stages h = 1, 2, 4, 8, then
the normalization), so the amax has the same bits. Its maxima skip the per-element finite test
(a float max leaves NaN out); a program whose maxima come out Inf reads its tiles again with it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.quantize import finite_amax, finite_magnitude
from fp4cli.kernels.tile_io import load_program_tile, seed_of
from fp4cli.kernels.tile_ops import FLOAT32_MAX, hadamard_cols, hadamard_rows, random_bits_at


@triton.jit(do_not_specialize=["row_rht_seed_value", "col_rht_seed_value"])
def amax_pair_kernel(
    x_ptr, amax_ptr, row_rht_seed_ptr, row_rht_seed_value, col_rht_seed_ptr, col_rht_seed_value,
    rows, cols, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr,
    ROW_ON: tl.constexpr, ROW_RHT_SEED_FROM_PTR: tl.constexpr, ROW_HADAMARD: tl.constexpr,
    ROW_LOG2_HADAMARD: tl.constexpr, ROW_HADAMARD_NORM: tl.constexpr,
    COL_ON: tl.constexpr, COL_RHT_SEED_FROM_PTR: tl.constexpr, COL_HADAMARD: tl.constexpr,
    COL_LOG2_HADAMARD: tl.constexpr, COL_HADAMARD_NORM: tl.constexpr,
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
                                     ROW_HADAMARD_NORM)  # fmt: skip
        tl.atomic_max(amax_ptr, finite_amax(row_tile))
    if COL_ON:
        col_tile = x
        if COL_HADAMARD > 0:
            seed = seed_of(col_rht_seed_ptr, col_rht_seed_value, COL_RHT_SEED_FROM_PTR)
            col_tile = hadamard_cols(x, seed, BR, BC, COL_HADAMARD, COL_LOG2_HADAMARD,
                                     COL_HADAMARD_NORM)  # fmt: skip
        tl.atomic_max(amax_ptr + 1, finite_amax(col_tile))


@triton.jit
def _signed_slab(x_ptr, row0, col0, rows, cols, seed, J: tl.constexpr, G: tl.constexpr,
                 BC: tl.constexpr):  # fmt: skip
    """(slab J of the tile: rows row0 + 16 g + J, zero outside x; the slab times its sign in
    the transform, the top bit of the random bits at position J as `hadamard_signs` draws)."""
    lines = row0 + 16 * tl.arange(0, G).to(tl.int64) + J
    positions = col0 + tl.arange(0, BC)
    mask = (lines < rows)[:, None] & (positions < cols)[None, :]
    slab = tl.load(x_ptr + lines[:, None] * cols + positions[None, :], mask=mask, other=0.0)
    slab = slab.to(tl.float32)
    bits = random_bits_at(seed, tl.full((1, 1), J, tl.int64))
    return slab, slab * (1.0 - 2.0 * (bits >> 31).to(tl.float32))


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
def _rht16_slab_maxima(x_ptr, row0, col0, rows, cols, seed, G: tl.constexpr, BC: tl.constexpr,
                       NORM: tl.constexpr, FINITE: tl.constexpr):  # fmt: skip
    """(largest |x|, largest |transformed x|) at each of the [G, BC] positions of the tile's
    16 slabs (rows row0 + 16 g + j, columns col0 + c); finite values only when FINITE."""
    r0, s0 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 0, G, BC)
    r1, s1 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 1, G, BC)
    r2, s2 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 2, G, BC)
    r3, s3 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 3, G, BC)
    r4, s4 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 4, G, BC)
    r5, s5 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 5, G, BC)
    r6, s6 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 6, G, BC)
    r7, s7 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 7, G, BC)
    r8, s8 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 8, G, BC)
    r9, s9 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 9, G, BC)
    r10, s10 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 10, G, BC)
    r11, s11 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 11, G, BC)
    r12, s12 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 12, G, BC)
    r13, s13 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 13, G, BC)
    r14, s14 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 14, G, BC)
    r15, s15 = _signed_slab(x_ptr, row0, col0, rows, cols, seed, 15, G, BC)
    plain = tl.maximum(
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
    # stage h = 1: slabs (j, j + 1) for even j
    s0, s1 = s0 + s1, s0 - s1
    s2, s3 = s2 + s3, s2 - s3
    s4, s5 = s4 + s5, s4 - s5
    s6, s7 = s6 + s7, s6 - s7
    s8, s9 = s8 + s9, s8 - s9
    s10, s11 = s10 + s11, s10 - s11
    s12, s13 = s12 + s13, s12 - s13
    s14, s15 = s14 + s15, s14 - s15
    # h = 2
    s0, s2 = s0 + s2, s0 - s2
    s1, s3 = s1 + s3, s1 - s3
    s4, s6 = s4 + s6, s4 - s6
    s5, s7 = s5 + s7, s5 - s7
    s8, s10 = s8 + s10, s8 - s10
    s9, s11 = s9 + s11, s9 - s11
    s12, s14 = s12 + s14, s12 - s14
    s13, s15 = s13 + s15, s13 - s15
    # h = 4
    s0, s4 = s0 + s4, s0 - s4
    s1, s5 = s1 + s5, s1 - s5
    s2, s6 = s2 + s6, s2 - s6
    s3, s7 = s3 + s7, s3 - s7
    s8, s12 = s8 + s12, s8 - s12
    s9, s13 = s9 + s13, s9 - s13
    s10, s14 = s10 + s14, s10 - s14
    s11, s15 = s11 + s15, s11 - s15
    # h = 8
    s0, s8 = s0 + s8, s0 - s8
    s1, s9 = s1 + s9, s1 - s9
    s2, s10 = s2 + s10, s2 - s10
    s3, s11 = s3 + s11, s3 - s11
    s4, s12 = s4 + s12, s4 - s12
    s5, s13 = s5 + s13, s5 - s13
    s6, s14 = s6 + s14, s6 - s14
    s7, s15 = s7 + s15, s7 - s15
    transformed = tl.maximum(
        tl.maximum(
            _largest(_magnitude(s0 * NORM, FINITE), _magnitude(s1 * NORM, FINITE),
                     _magnitude(s2 * NORM, FINITE), _magnitude(s3 * NORM, FINITE)),
            _largest(_magnitude(s4 * NORM, FINITE), _magnitude(s5 * NORM, FINITE),
                     _magnitude(s6 * NORM, FINITE), _magnitude(s7 * NORM, FINITE)),
        ),
        tl.maximum(
            _largest(_magnitude(s8 * NORM, FINITE), _magnitude(s9 * NORM, FINITE),
                     _magnitude(s10 * NORM, FINITE), _magnitude(s11 * NORM, FINITE)),
            _largest(_magnitude(s12 * NORM, FINITE), _magnitude(s13 * NORM, FINITE),
                     _magnitude(s14 * NORM, FINITE), _magnitude(s15 * NORM, FINITE)),
        ),
    )  # fmt: skip
    return plain, transformed


@triton.jit
def _program_maxima(x_ptr, rows, cols, tiles, tiles_c, seed, G: tl.constexpr, BC: tl.constexpr,
                    NORM: tl.constexpr, FINITE: tl.constexpr):  # fmt: skip
    """(largest |x|, largest |transformed x|) over this program's tiles of
    `amax_rht16_cols_kernel`; finite values only when FINITE."""
    plain = tl.zeros((G, BC), tl.float32)
    transformed = tl.zeros((G, BC), tl.float32)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        row0 = ((tile // tiles_c) * 16 * G).to(tl.int64)
        col0 = ((tile % tiles_c) * BC).to(tl.int64)
        tile_plain, tile_transformed = _rht16_slab_maxima(
            x_ptr, row0, col0, rows, cols, seed, G, BC, NORM, FINITE
        )
        plain = tl.maximum(plain, tile_plain)
        transformed = tl.maximum(transformed, tile_transformed)
    return (tl.max(tl.max(plain, axis=1), axis=0),
            tl.max(tl.max(transformed, axis=1), axis=0))  # fmt: skip


@triton.jit(do_not_specialize=["rht_seed_value"])
def amax_rht16_cols_kernel(
    x_ptr, amax_ptr, rht_seed_ptr, rht_seed_value, rows, cols, tiles, tiles_c,
    G: tl.constexpr, BC: tl.constexpr, PLAIN: tl.constexpr, RHT_SEED_FROM_PTR: tl.constexpr,
    NORM: tl.constexpr,
):  # fmt: skip
    """amax_ptr[1]: the largest finite |value| of x (rows, cols) after the 16-point random
    Hadamard transform down its columns (rows padded with zeros to a multiple of 16); with
    PLAIN, amax_ptr[0]: the largest finite |x|. Tile t holds rows [16 G (t // tiles_c),
    16 G (t // tiles_c + 1)) of columns [BC (t % tiles_c), ..); program p reads tiles p,
    p + programs, .. and adds its maxima by one atomic per direction. The maxima leave NaN
    out by themselves (the running maxima start at 0); only a program that meets an Inf reads
    its tiles again with the finite filter."""
    seed = seed_of(rht_seed_ptr, rht_seed_value, RHT_SEED_FROM_PTR)
    plain, transformed = _program_maxima(x_ptr, rows, cols, tiles, tiles_c, seed, G, BC, NORM,
                                         False)  # fmt: skip
    if not ((plain <= FLOAT32_MAX) & (transformed <= FLOAT32_MAX)):  # an Inf (or a kept NaN)
        plain, transformed = _program_maxima(x_ptr, rows, cols, tiles, tiles_c, seed, G, BC,
                                             NORM, True)  # fmt: skip
    if PLAIN:
        tl.atomic_max(amax_ptr, plain)
    tl.atomic_max(amax_ptr + 1, transformed)
