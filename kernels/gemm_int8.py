"""The exact MXFP4 GEMM on INT8 tensor cores, for tiles whose rows span at most 4 binades.

A row whose blocks all lie within 3 binades of its largest scale (`gemm_prep` flag 4 unset)
holds integers q * 2 * 2^k, |value| <= 96, in INT8 (`gemm_words`), so the tensor cores sum its
products exactly in int32 (|sum| <= 9216 K < 2^31 for K < 233,000) and the epilogue rounds
each output once. Tiles with a wider row are left to the FP8 kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm_fp8 import store_tile, tile_flags, tile_ids
from fp4cli.kernels.gemm_prep import FLAG_BEYOND_INT8
from fp4cli.kernels.gemm_tiles import scale_outer

INT8_TOP = tl.constexpr(4)  # the largest block's values are q * 2^4 (2 * 6 * 2^3 = 96)


@triton.jit
def mxfp4_int8_gemm_kernel(
    a_int8_ptr, a_ref_ptr, a_flags_ptr, b_int8_ptr, b_ref_ptr, b_flags_ptr,
    out_ptr, M, N, k_padded, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
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
    if tile_flags(flags_a, flags_b, FLAG_BEYOND_INT8):  # the FP8 kernel's tile
        return
    ref_a = tl.load(a_ref_ptr + ra, mask=ra_ok, other=0)
    ref_b = tl.load(b_ref_ptr + rb, mask=rb_ok, other=0)
    acc = tl.zeros([BM, BN], tl.int32)
    for k0 in range(0, k_padded, BK):
        position = k0 + tl.arange(0, BK)
        k_ok = (position < k_padded)[None, :]
        a = tl.load(a_int8_ptr + ra64[:, None] * k_padded + position[None, :],
                    mask=ra_ok[:, None] & k_ok, other=0)  # fmt: skip
        b = tl.load(b_int8_ptr + rb64[:, None] * k_padded + position[None, :],
                    mask=rb_ok[:, None] & k_ok, other=0)  # fmt: skip
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
    value = scale_outer(acc.to(tl.float32), ref_a - 127 - INT8_TOP, ref_b - 127 - INT8_TOP)
    store_tile(out_ptr, value, flags_a, flags_b, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on)
