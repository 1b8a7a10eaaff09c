"""Where a GEMM program's tile lies, and its loads and stores, shared by the MXFP4 GEMM
kernels. Operands are row-major (rows, K); the output is (M, N) with any strides.

Facts (`gemm.prep`): one int32 tensor (3, M + N): each row's reference scale code, then its
flags, then its INT8 segment's reference, the rows of A before the rows of B.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.prep import FLAG_NAN


@triton.jit
def tile_ids(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of this program, GROUP_M row tiles at a time (B's tiles stay in L2)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    return pid_m, pid_n


@triton.jit
def tile_rows(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's A rows and B rows: (ra, ra_ok, ra64, rb, rb_ok, rb64), the indices, which
    exist, and the indices as int64 (for offsets past 2^31)."""
    pid_m, pid_n = tile_ids(M, N, BM, BN, GROUP_M)
    ra = pid_m * BM + tl.arange(0, BM)
    rb = pid_n * BN + tl.arange(0, BN)
    return ra, ra < M, ra.to(tl.int64), rb, rb < N, rb.to(tl.int64)


@triton.jit
def load_facts(facts_ptr, row, row_ok, first_row, all_rows):
    """(reference scale codes, flags) of an operand's rows (its rows start at `first_row`)."""
    ref = tl.load(facts_ptr + first_row + row, mask=row_ok, other=0)
    flags = tl.load(facts_ptr + all_rows + first_row + row, mask=row_ok, other=0)
    return ref, flags


@triton.jit
def load_segment_refs(facts_ptr, row, row_ok, first_row, all_rows):
    """The INT8 segment's reference scale codes of an operand's rows (facts' third row)."""
    return tl.load(facts_ptr + 2 * all_rows + first_row + row, mask=row_ok, other=0)


@triton.jit
def tile_flags(flags_a, flags_b, FLAG: tl.constexpr):
    """Whether any of the tile's A rows or B rows carries FLAG."""
    return (tl.max(flags_a & FLAG, axis=0) + tl.max(flags_b & FLAG, axis=0)) != 0


@triton.jit
def enclosing_tile_flags(facts_ptr, ra, rb, M, N, WIDE_M: tl.constexpr, WIDE_N: tl.constexpr,
                         FLAG: tl.constexpr):  # fmt: skip
    """Whether any A row or B row of the WIDE_M x WIDE_N tile (of another kernel's tiling, whose
    tiles hold whole tiles of this one) that holds this tile carries FLAG."""
    wide_a = tl.min(ra, axis=0) // WIDE_M * WIDE_M + tl.arange(0, WIDE_M)
    wide_b = tl.min(rb, axis=0) // WIDE_N * WIDE_N + tl.arange(0, WIDE_N)
    flags_a = load_facts(facts_ptr, wide_a, wide_a < M, 0, M + N)[1]
    flags_b = load_facts(facts_ptr, wide_b, wide_b < N, M, M + N)[1]
    return tile_flags(flags_a, flags_b, FLAG)


@triton.jit
def store_tile(out_ptr, bias_ptr, value, flags_a, flags_b, ra64, ra_ok, rb64, rb_ok, stride_om,
               stride_on, HAS_BIAS: tl.constexpr):  # fmt: skip
    """Store a tile plus the bias (`store_sums`), NaN in the rows of A and columns of B that
    hold a NaN block."""
    nan = ((flags_a & FLAG_NAN)[:, None] + (flags_b & FLAG_NAN)[None, :]) != 0
    value = tl.where(nan, float("nan"), value)
    store_sums(out_ptr, bias_ptr, value, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on, HAS_BIAS)


@triton.jit
def store_sums(out_ptr, bias_ptr, sums, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on,
               HAS_BIAS: tl.constexpr):  # fmt: skip
    """Store float32 sums rounded once to the output's dtype, with HAS_BIAS the bias (N,) added
    in float32 first, as cuBLAS's epilogue adds it."""
    if HAS_BIAS:
        sums = sums + tl.load(bias_ptr + rb64, mask=rb_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + ra64[:, None] * stride_om + rb64[None, :] * stride_on
    tl.store(out, sums.to(out_ptr.dtype.element_ty), mask=ra_ok[:, None] & rb_ok[None, :])


@triton.jit
def load_codes(codes_ptr, rows64, row_ok, k0, k_padded, WIDTH: tl.constexpr):
    """The [rows, WIDTH / 2] packed codes of K positions k0 .. k0 + WIDTH (zero past K)."""
    byte = k0 // 2 + tl.arange(0, WIDTH // 2)
    return tl.load(
        codes_ptr + rows64[:, None] * (k_padded // 2) + byte[None, :],
        mask=row_ok[:, None] & (byte < k_padded // 2)[None, :],
        other=0,
    )


@triton.jit
def load_rows(ptr, rows64, row_ok, k0, k_padded, WIDTH: tl.constexpr):
    """The [rows, WIDTH] bytes of a staged (rows, K) operand at K offset k0 (zero past K)."""
    position = k0 + tl.arange(0, WIDTH)
    return tl.load(
        ptr + rows64[:, None] * k_padded + position[None, :],
        mask=row_ok[:, None] & (position < k_padded)[None, :],
        other=0,
    )


@triton.jit
def load_window_scales(scales_ptr, rows64, row_ok, k0, k_padded, WIDTH: tl.constexpr,
                       BLOCK: tl.constexpr):  # fmt: skip
    """[rows, WIDTH / 32] E8M0 scale codes, one per 32-element window at K offset k0 (a block
    of BLOCK, a multiple of 32, spans BLOCK / 32 windows)."""
    window = k0 + 32 * tl.arange(0, WIDTH // 32)
    return tl.load(
        scales_ptr + rows64[:, None] * (k_padded // BLOCK) + (window // BLOCK)[None, :],
        mask=row_ok[:, None] & (window < k_padded)[None, :],
        other=0,
    )
