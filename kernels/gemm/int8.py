"""The exact MXFP4 GEMM on INT8 tensor cores, for tiles whose rows span at most 4 binades.

A row whose blocks all lie within 3 binades of its largest scale (`gemm.prep` flag 4 unset)
holds integers q * 2 * 2^k, |value| <= 96, in INT8 (`gemm.words`), so the tensor cores sum its
products exactly in int32 (|sum| <= 9216 K < 2^31 for K < 233,000) and the epilogue rounds
each output once. Tiles with a wider row are left to the FP8 kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.io import load_facts, load_rows, store_tile, tile_flags, tile_rows
from fp4cli.kernels.gemm.prep import FLAG_BEYOND_INT8
from fp4cli.kernels.gemm.tiles import scale_outer

INT8_TOP = tl.constexpr(4)  # the largest block's values are q * 2^4 (2 * 6 * 2^3 = 96)


@triton.jit
def mxfp4_int8_gemm_kernel(
    a_int8_ptr, b_int8_ptr, facts_ptr, out_ptr, M, N, k_padded, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    ra, ra_ok, ra64, rb, rb_ok, rb64 = tile_rows(M, N, BM, BN, GROUP_M)
    ref_a, flags_a = load_facts(facts_ptr, ra, ra_ok, 0, M + N)
    ref_b, flags_b = load_facts(facts_ptr, rb, rb_ok, M, M + N)
    if tile_flags(flags_a, flags_b, FLAG_BEYOND_INT8):  # the FP8 kernel's tile
        return
    acc = tl.zeros([BM, BN], tl.int32)
    for k0 in range(0, k_padded, BK):
        a = load_rows(a_int8_ptr, ra64, ra_ok, k0, k_padded, BK)
        b = load_rows(b_int8_ptr, rb64, rb_ok, k0, k_padded, BK)
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
    value = scale_outer(acc.to(tl.float32), ref_a - 127 - INT8_TOP, ref_b - 127 - INT8_TOP)
    store_tile(out_ptr, value, flags_a, flags_b, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on)
