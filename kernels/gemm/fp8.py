"""The MXFP4 GEMM on FP8 tensor cores (Hopper): C = dequantize(A) @ dequantize(B)^T.

A (M, K) and B (N, K) are blocked along K with E8M0 scales (blocks of a multiple of 32). Each
row's blocks are folded into E5M2 against the row's largest scale (`gemm.prep`), read staged
from memory or, FUSED, decoded in registers from the packed codes, and the tensor cores multiply
the E5M2 tiles. Every 32-element window of K lies in one block of each operand, so the products
of a window share one power of two and their sum (at most 13 significant bits) is exact in the
tensor core's accumulator, which keeps 14; the epilogue applies 2^(ref_a + ref_b - 26) once.

EXACT: every window's partial sum is added to the float32 accumulator (promotion every 32), so
the result is the float32 accumulation of the exact products; a tile with a row beyond E5M2's
fold range takes the per-window path (`gemm.window`) instead. With SKIP_NARROW, tiles are left
to the INT8 kernel (`gemm.int8`) where the INT8 kernel's tile holding them (NARROW_BM x NARROW_BN,
whole tiles of this kernel's) has all its rows within INT8's range: that kernel writes those.
Fast: promotion every BK (the tensor core sums BK / 32 windows in its 14-bit accumulator
between), and blocks more than 26 binades below their row's largest are flushed.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.io import (
    enclosing_tile_flags,
    load_codes,
    load_facts,
    load_rows,
    load_window_scales,
    store_tile,
    tile_flags,
    tile_rows,
)
from fp4cli.kernels.gemm.prep import FLAG_BEYOND_E5M2, FLAG_BEYOND_INT8
from fp4cli.kernels.gemm.tiles import FOLD_RANGE, FP8_TOP, decode_e5m2, per_byte, scale_outer
from fp4cli.kernels.gemm.window import window_product


@triton.jit
def load_e5m2(codes_ptr, scales_ptr, staged_ptr, rows64, row_ok, ref, k0, k_padded,
              WIDTH: tl.constexpr, BLOCK: tl.constexpr, FUSED: tl.constexpr):  # fmt: skip
    """The [rows, WIDTH] E5M2 tile at K offset k0, each block folded against its row's
    reference scale code `ref`: decoded in registers (FUSED) or loaded staged."""
    if FUSED:
        codes = load_codes(codes_ptr, rows64, row_ok, k0, k_padded, WIDTH)
        scale_codes = load_window_scales(scales_ptr, rows64, row_ok, k0, k_padded, WIDTH, BLOCK)
        shift = scale_codes.to(tl.int32) - ref[:, None] + FOLD_RANGE
        return decode_e5m2(codes, per_byte(shift, 16))
    staged = load_rows(staged_ptr, rows64, row_ok, k0, k_padded, WIDTH)
    return staged.to(tl.float8e5, bitcast=True)


@triton.jit
def mxfp4_fp8_gemm_kernel(
    a_codes_ptr, a_scales_ptr, a_e5m2_ptr, b_codes_ptr, b_scales_ptr, b_e5m2_ptr, facts_ptr,
    out_ptr, bias_ptr, M, N, k_padded, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK: tl.constexpr, FUSED: tl.constexpr, EXACT: tl.constexpr, SKIP_NARROW: tl.constexpr,
    NARROW_BM: tl.constexpr, NARROW_BN: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    ra, ra_ok, ra64, rb, rb_ok, rb64 = tile_rows(M, N, BM, BN, GROUP_M)
    ref_a, flags_a = load_facts(facts_ptr, ra, ra_ok, 0, M + N)
    ref_b, flags_b = load_facts(facts_ptr, rb, rb_ok, M, M + N)
    # constexpr conditions outside, tensor conditions inside: Triton folds the outer `if`
    if SKIP_NARROW:  # noqa: SIM102
        if not enclosing_tile_flags(facts_ptr, ra, rb, M, N, NARROW_BM, NARROW_BN,
                                    FLAG_BEYOND_INT8):  # fmt: skip
            return
    acc = tl.zeros([BM, BN], tl.float32)
    per_window = False
    if EXACT:
        per_window = tile_flags(flags_a, flags_b, FLAG_BEYOND_E5M2)
    if per_window:
        for k0 in range(0, k_padded, 32):
            acc += window_product(a_codes_ptr, a_scales_ptr, b_codes_ptr, b_scales_ptr,
                                  ra64, ra_ok, rb64, rb_ok, k0, k_padded, BLOCK)  # fmt: skip
        value = acc
    else:
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
    store_tile(out_ptr, bias_ptr, value, flags_a, flags_b, ra64, ra_ok, rb64, rb_ok, stride_om,
               stride_on, HAS_BIAS)  # fmt: skip
