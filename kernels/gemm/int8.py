"""The exact MXFP4 GEMM on INT8 tensor cores, for tiles whose rows span at most 4 binades over
K's INT8 segment, with that tile's FP8 segment (`gemm.split`) in the same program.

A row whose INT8-segment blocks all lie within 3 binades of that segment's largest scale
(`gemm.prep` flag 4 unset) holds integers q * 2 * 2^k, |value| <= 96, in INT8 (`gemm.words`),
so the tensor cores sum its products exactly in int32 (|sum| <= 9216 K < 2^31 for K < 233,000).
Without a split that is all of K, and the epilogue rounds each output once. With one, the int32
sum is rounded to float32 and moved, by powers of two, into the frame of the FP8 kernel
(`gemm.fp8`: values q * 2^13 against the row's largest scale), and the FP8 segment's windows
are added to it on the FP8 tensor cores with promotion every 32: the float32 accumulation of
the exact products. Tiles with a row flagged 4 are left to the FP8 kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.io import (
    load_facts,
    load_rows,
    load_segment_refs,
    store_tile,
    tile_flags,
    tile_rows,
)
from fp4cli.kernels.gemm.prep import FLAG_BEYOND_INT8
from fp4cli.kernels.gemm.tiles import FP8_TOP, scale_outer

INT8_TOP = tl.constexpr(4)  # the largest block's values are q * 2^4 (2 * 6 * 2^3 = 96)


@triton.jit
def fp8_segment(acc, a_e5m2_ptr, b_e5m2_ptr, ra64, ra_ok, rb64, rb_ok, k_end, k_padded,
                HI_BK: tl.constexpr):  # fmt: skip
    """acc plus the E5M2-staged windows before K offset k_end, promoted every 32."""
    for k0 in range(0, k_end, HI_BK):
        a = load_rows(a_e5m2_ptr, ra64, ra_ok, k0, k_padded, HI_BK).to(tl.float8e5, bitcast=True)
        b = load_rows(b_e5m2_ptr, rb64, rb_ok, k0, k_padded, HI_BK).to(tl.float8e5, bitcast=True)
        acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=32)
    return acc


@triton.jit
def int8_segment(a_int8_ptr, b_int8_ptr, ra64, ra_ok, rb64, rb_ok, k_start, k_padded,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """The exact int32 sums over the INT8-staged K offsets k_start .. k_padded."""
    acc = tl.zeros([BM, BN], tl.int32)
    for k0 in range(k_start, k_padded, BK):
        a = load_rows(a_int8_ptr, ra64, ra_ok, k0, k_padded, BK)
        b = load_rows(b_int8_ptr, rb64, rb_ok, k0, k_padded, BK)
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
    return acc


@triton.jit
def mxfp4_int8_gemm_kernel(
    a_int8_ptr, b_int8_ptr, a_e5m2_ptr, b_e5m2_ptr, facts_ptr, lo_start_ptr, out_ptr, bias_ptr,
    M, N, k_padded, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT: tl.constexpr, HI_BK: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    ra, ra_ok, ra64, rb, rb_ok, rb64 = tile_rows(M, N, BM, BN, GROUP_M)
    ref_a, flags_a = load_facts(facts_ptr, ra, ra_ok, 0, M + N)
    ref_b, flags_b = load_facts(facts_ptr, rb, rb_ok, M, M + N)
    if tile_flags(flags_a, flags_b, FLAG_BEYOND_INT8):  # the FP8 kernel's tile
        return
    lo_a = load_segment_refs(facts_ptr, ra, ra_ok, 0, M + N)
    lo_b = load_segment_refs(facts_ptr, rb, rb_ok, M, M + N)
    k_lo = 0
    if SPLIT:
        k_lo = tl.multiple_of(tl.load(lo_start_ptr) * 32, 64)
    if k_lo == 0:  # no FP8 segment: all of K on INT8 (compiled apart, without its registers)
        acc = int8_segment(a_int8_ptr, b_int8_ptr, ra64, ra_ok, rb64, rb_ok, 0, k_padded, BM,
                           BN, BK)  # fmt: skip
        value = scale_outer(acc.to(tl.float32), lo_a - 127 - INT8_TOP, lo_b - 127 - INT8_TOP)
    else:
        acc = int8_segment(a_int8_ptr, b_int8_ptr, ra64, ra_ok, rb64, rb_ok, k_lo, k_padded,
                           BM, BN, BK)  # fmt: skip
        # into the FP8 frame: 2^(lo - 127 - INT8_TOP) = 2^(ref - 127 - FP8_TOP) 2^(lo - ref + 9)
        value = scale_outer(acc.to(tl.float32), lo_a - ref_a + FP8_TOP - INT8_TOP,
                            lo_b - ref_b + FP8_TOP - INT8_TOP)  # fmt: skip
        value = fp8_segment(value, a_e5m2_ptr, b_e5m2_ptr, ra64, ra_ok, rb64, rb_ok, k_lo,
                            k_padded, HI_BK)  # fmt: skip
        value = scale_outer(value, ref_a - 127 - FP8_TOP, ref_b - 127 - FP8_TOP)
    store_tile(out_ptr, bias_ptr, value, flags_a, flags_b, ra64, ra_ok, rb64, rb_ok, stride_om,
               stride_on, HAS_BIAS)  # fmt: skip
