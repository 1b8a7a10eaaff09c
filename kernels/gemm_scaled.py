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

from fp4cli.kernels.gemm_io import load_codes, tile_ids
from fp4cli.kernels.gemm_tiles import decode_float, per_byte


@triton.jit
def scaled_dot_kernel(
    a_codes_ptr, a_scales_ptr, b_codes_ptr, b_scales_ptr,
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
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, k_padded, BK):
        a = load_codes(a_codes_ptr, ra64, ra_ok, k0, k_padded, BK)
        b = load_codes(b_codes_ptr, rb64, rb_ok, k0, k_padded, BK)
        scale_a = _window_scales(a_scales_ptr, ra64, ra_ok, k0, k_padded, BK)
        scale_b = _window_scales(b_scales_ptr, rb64, rb_ok, k0, k_padded, BK)
        acc = tl.dot_scaled(a, scale_a, "e2m1", tl.trans(b), scale_b, "e2m1", acc)
    out = out_ptr + ra64[:, None] * stride_om + rb64[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ra_ok[:, None] & rb_ok[None, :])


@triton.jit
def _window_scales(scales_ptr, rows64, row_ok, k0, k_padded, WIDTH: tl.constexpr):
    """[rows, WIDTH / 32] E8M0 scale codes of blocks of 32 at K offset k0."""
    block = k0 // 32 + tl.arange(0, WIDTH // 32)
    return tl.load(
        scales_ptr + rows64[:, None] * (k_padded // 32) + block[None, :],
        mask=row_ok[:, None] & (block < k_padded // 32)[None, :],
        other=0,
    )


@triton.jit
def weight_only_kernel(
    a_ptr, b_codes_ptr, b_scales_ptr, out_ptr, M, N, K, k_padded, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tile_ids(M, N, BM, BN, GROUP_M)
    ra = pid_m * BM + tl.arange(0, BM)
    rb = pid_n * BN + tl.arange(0, BN)
    ra_ok = ra < M
    rb_ok = rb < N
    ra64 = ra.to(tl.int64)
    rb64 = rb.to(tl.int64)
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
        window = k0 + 32 * tl.arange(0, BK // 32)
        scale_codes = tl.load(
            b_scales_ptr + rb64[:, None] * (k_padded // BLOCK) + (window // BLOCK)[None, :],
            mask=rb_ok[:, None] & (window < k_padded)[None, :],
            other=0,
        ).to(tl.int32)
        b = decode_float(codes, per_byte(scale_codes, 16)).to(dtype)
        if dtype == tl.float32:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
    out = out_ptr + ra64[:, None] * stride_om + rb64[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ra_ok[:, None] & rb_ok[None, :])
