"""The MXFP4 GEMM on FP8 tensor cores (Hopper): C = dequantize(A) @ dequantize(B)^T.

A (M, K) and B (N, K) are blocked along K with E8M0 scales (blocks of a multiple of 32). Each
row's blocks are folded into E5M2 against the row's largest scale (`gemm_prep`), read staged
from memory or, FUSED, decoded in registers from the packed codes, and the tensor cores multiply
the E5M2 tiles. Every 32-element window of K lies in one block of each operand, so the products
of a window share one power of two and their sum (at most 13 significant bits) is exact in the
tensor core's accumulator, which keeps 14; the epilogue applies 2^(ref_a + ref_b - 26) once.

EXACT: every window's partial sum is added to the float32 accumulator (promotion every 32), so
the result is the float32 accumulation of the exact products. Tiles with a row beyond E5M2's
range are left to the per-window kernel (`gemm_window`) and, with SKIP_NARROW, tiles whose rows
are all within INT8's range to the INT8 kernel (`gemm_int8`).
Fast: promotion every BK (the tensor core sums BK / 32 windows in its 14-bit accumulator
between), and blocks more than 26 binades below their row's largest are flushed.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm_prep import FLAG_BEYOND_E5M2, FLAG_BEYOND_INT8, FLAG_NAN
from fp4cli.kernels.gemm_tiles import FOLD_RANGE, FP8_TOP, decode_e5m2, per_byte, scale_outer


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
def tile_flags(flags_a, flags_b, FLAG: tl.constexpr):
    """Whether any of the tile's A rows or B rows carries FLAG."""
    return (tl.max(flags_a & FLAG, axis=0) + tl.max(flags_b & FLAG, axis=0)) != 0


@triton.jit
def store_tile(out_ptr, value, flags_a, flags_b, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on):
    """Store a tile, NaN in the rows of A and columns of B that hold a NaN block."""
    nan = ((flags_a & FLAG_NAN)[:, None] + (flags_b & FLAG_NAN)[None, :]) != 0
    value = tl.where(nan, float("nan"), value)
    out = out_ptr + ra64[:, None] * stride_om + rb64[None, :] * stride_on
    tl.store(out, value.to(out_ptr.dtype.element_ty), mask=ra_ok[:, None] & rb_ok[None, :])


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
def load_e5m2(codes_ptr, scales_ptr, staged_ptr, rows64, row_ok, ref, k0, k_padded,
              WIDTH: tl.constexpr, BLOCK: tl.constexpr, FUSED: tl.constexpr):  # fmt: skip
    """The [rows, WIDTH] E5M2 tile at K offset k0, each block folded against its row's
    reference scale code `ref`: decoded in registers (FUSED) or loaded staged."""
    if FUSED:
        codes = load_codes(codes_ptr, rows64, row_ok, k0, k_padded, WIDTH)
        window = k0 + 32 * tl.arange(0, WIDTH // 32)
        scale_codes = tl.load(
            scales_ptr + rows64[:, None] * (k_padded // BLOCK) + (window // BLOCK)[None, :],
            mask=row_ok[:, None] & (window < k_padded)[None, :],
            other=0,
        ).to(tl.int32)
        shift = scale_codes - ref[:, None] + FOLD_RANGE
        return decode_e5m2(codes, per_byte(shift, 16))
    staged = load_rows(staged_ptr, rows64, row_ok, k0, k_padded, WIDTH)
    return staged.to(tl.float8e5, bitcast=True)


@triton.jit
def mxfp4_fp8_gemm_kernel(
    a_codes_ptr, a_scales_ptr, a_e5m2_ptr, a_ref_ptr, a_flags_ptr,
    b_codes_ptr, b_scales_ptr, b_e5m2_ptr, b_ref_ptr, b_flags_ptr,
    out_ptr, M, N, k_padded, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK: tl.constexpr, FUSED: tl.constexpr, EXACT: tl.constexpr, SKIP_NARROW: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tile_ids(M, N, BM, BN, GROUP_M)
    ra = pid_m * BM + tl.arange(0, BM)
    rb = pid_n * BN + tl.arange(0, BN)
    ra_ok = ra < M
    rb_ok = rb < N
    ra64 = ra.to(tl.int64)
    rb64 = rb.to(tl.int64)
    flags_a = tl.load(a_flags_ptr + ra, mask=ra_ok, other=0)
    flags_b = tl.load(b_flags_ptr + rb, mask=rb_ok, other=0)
    # constexpr conditions outside, tensor conditions inside: Triton folds the outer `if`
    if SKIP_NARROW:  # noqa: SIM102
        if not tile_flags(flags_a, flags_b, FLAG_BEYOND_INT8):
            return
    if EXACT:  # noqa: SIM102
        if tile_flags(flags_a, flags_b, FLAG_BEYOND_E5M2):
            return
    ref_a = tl.load(a_ref_ptr + ra, mask=ra_ok, other=0)
    ref_b = tl.load(b_ref_ptr + rb, mask=rb_ok, other=0)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, k_padded, BK):
        a = load_e5m2(a_codes_ptr, a_scales_ptr, a_e5m2_ptr, ra64, ra_ok, ref_a,
                      k0, k_padded, BK, BLOCK, FUSED)  # fmt: skip
        b = load_e5m2(b_codes_ptr, b_scales_ptr, b_e5m2_ptr, rb64, rb_ok, ref_b,
                      k0, k_padded, BK, BLOCK, FUSED)  # fmt: skip
        if EXACT:
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=32)
        else:
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=BK)
    # the values were q * 2^(code - ref + 13): undo both operands' folding
    value = scale_outer(acc, ref_a - 127 - FP8_TOP, ref_b - 127 - FP8_TOP)
    store_tile(out_ptr, value, flags_a, flags_b, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on)
