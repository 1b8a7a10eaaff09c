"""Two more MXFP4 GEMM kernels beside the FP8 one:

`scaled_dot_kernel`: both operands as packed E2M1 codes with E8M0 block scales (block 32),
multiplied by Triton's `tl.dot_scaled`: the native MXFP4 tensor-core MMA on Blackwell; on
Hopper, Triton decodes both to bfloat16 and runs bf16 MMAs.

`weight_only_kernel`: a float A (bf16, fp16 or fp32) against a quantized B, decoded in
registers to A's dtype (an E2M1 value times an E8M0 scale is exactly a bfloat16 number) and
multiplied on the tensor cores in that dtype with float32 accumulation (fp32: IEEE products).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.io import load_codes, load_window_scales, store_sums, tile_rows
from fp4cli.kernels.gemm.tiles import decode_float, per_byte


@triton.jit
def scaled_dot_kernel(
    a_codes_ptr, a_scales_ptr, b_codes_ptr, b_scales_ptr,
    out_ptr, bias_ptr, M, N, k_padded, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):  # fmt: skip
    ra, ra_ok, ra64, rb, rb_ok, rb64 = tile_rows(M, N, BM, BN, GROUP_M)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, k_padded, BK):
        a = load_codes(a_codes_ptr, ra64, ra_ok, k0, k_padded, BK)
        b = load_codes(b_codes_ptr, rb64, rb_ok, k0, k_padded, BK)
        scale_a = load_window_scales(a_scales_ptr, ra64, ra_ok, k0, k_padded, BK, 32)
        scale_b = load_window_scales(b_scales_ptr, rb64, rb_ok, k0, k_padded, BK, 32)
        acc = tl.dot_scaled(a, scale_a, "e2m1", tl.trans(b), scale_b, "e2m1", acc)
    store_sums(out_ptr, bias_ptr, acc, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on, HAS_BIAS)


@triton.jit
def weight_only_kernel(
    a_ptr, b_codes_ptr, b_scales_ptr, out_ptr, bias_ptr, M, N, K, k_padded, stride_om,
    stride_on, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    ra, ra_ok, ra64, rb, rb_ok, rb64 = tile_rows(M, N, BM, BN, GROUP_M)
    dtype: tl.constexpr = a_ptr.dtype.element_ty
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, k_padded, BK):
        position = k0 + tl.arange(0, BK)
        a = tl.load(
            a_ptr + ra64[:, None] * K + position[None, :],
            mask=ra_ok[:, None] & (position < K)[None, :],
            other=0.0,
        )
        codes = load_codes(b_codes_ptr, rb64, rb_ok, k0, k_padded, BK)
        scale_codes = load_window_scales(b_scales_ptr, rb64, rb_ok, k0, k_padded, BK, BLOCK)
        b = decode_float(codes, per_byte(scale_codes.to(tl.int32), 16)).to(dtype)
        if dtype == tl.float32:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
    store_sums(out_ptr, bias_ptr, acc, ra64, ra_ok, rb64, rb_ok, stride_om, stride_on, HAS_BIAS)
