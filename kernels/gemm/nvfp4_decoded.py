"""The NVFP4 GEMM's second implementation, in two elementwise kernels around a bf16 GEMM:

`nvfp4_decode_kernel`: one operand's packed E2M1 codes and E4M3 block-scale codes to a
(rows, K_padded) tensor of q * s in its natural element order (bfloat16 on the GPU: exact), by
the fused kernel's bit arithmetic (`gemm.nvfp4`) on bytes: a byte sign-extended to int32 has
its high code's sign on bit 31 already, so one shift and a mask decode it.

`nvfp4_alpha_kernel`: the float32 GEMM result times alpha = fl32(amax_a * amax_b) / factor
(plus a bias, in float32), rounded once to the output's dtype: the epilogue the fused kernel
applies in registers.

`nvfp4_alpha_scalar_kernel`: alpha alone, into a one-element tensor, for a GEMM that applies it
in its own epilogue (`gemm.cublaslt`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.io import store_sums
from fp4cli.kernels.gemm.nvfp4 import E2M1_FLOAT_BITS, VALUE_UNDO, e4m3_scale_2p118, epilogue_alpha


@triton.jit
def decode_halves(codes, scale_codes):
    """[R, W] packed codes (uint8) and [R, W / 8] E4M3 scale codes (uint8) -> (low nibbles',
    high nibbles') q * s / VALUE_UNDO, each [R, W] float32; NaN in NaN blocks."""
    R: tl.constexpr = codes.shape[0]
    W: tl.constexpr = codes.shape[1]
    scale = e4m3_scale_2p118(scale_codes.to(tl.int32))
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (R, W // 8, 8)), (R, W))
    byte = codes.to(tl.int8, bitcast=True).to(tl.int32)  # bits 8-31 copy bit 7
    # low nibble: bits 0-3 to 28-31, then (arithmetic shift) magnitude to 22-24, sign kept
    low = (((byte << 28) >> 6) & E2M1_FLOAT_BITS).to(tl.float32, bitcast=True)
    # high nibble: bits 4-6 to 22-24; bit 31 holds a copy of bit 7, the sign
    high = ((byte << 18) & E2M1_FLOAT_BITS).to(tl.float32, bitcast=True)
    return low * scale, high * scale


@triton.jit
def nvfp4_decode_kernel(
    codes_ptr, scales_ptr, out_ptr, rows, k_padded,
    ROWS: tl.constexpr, BYTES: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    byte = tl.program_id(1) * BYTES + tl.arange(0, BYTES)
    block = tl.program_id(1) * (BYTES // 8) + tl.arange(0, BYTES // 8)
    row64 = row.to(tl.int64)[:, None]
    row_ok = (row < rows)[:, None]
    codes = tl.load(
        codes_ptr + row64 * (k_padded // 2) + byte[None, :],
        mask=row_ok & (byte < k_padded // 2)[None, :],
        other=0,
    )
    scales = tl.load(
        scales_ptr + row64 * (k_padded // 16) + block[None, :],
        mask=row_ok & (block < k_padded // 16)[None, :],
        other=0,
    )
    low, high = decode_halves(codes, scales)
    values = tl.reshape(tl.join(low, high), (ROWS, 2 * BYTES)) * VALUE_UNDO  # exact
    position = tl.program_id(1) * (2 * BYTES) + tl.arange(0, 2 * BYTES)
    tl.store(
        out_ptr + row64 * k_padded + position[None, :],
        values.to(out_ptr.dtype.element_ty),
        mask=row_ok & (position < k_padded)[None, :],
    )


@triton.jit
def nvfp4_alpha_kernel(
    product_ptr, a_amax_ptr, b_amax_ptr, factor, out_ptr, bias_ptr, M, N, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rm64, rn64, rm_ok, rn_ok = rm.to(tl.int64), rn.to(tl.int64), rm < M, rn < N
    product = tl.load(product_ptr + rm64[:, None] * N + rn64[None, :],
                      mask=rm_ok[:, None] & rn_ok[None, :], other=0.0)  # fmt: skip
    value = product * epilogue_alpha(a_amax_ptr, b_amax_ptr, factor)
    # fl32(fl32(alpha * sum) + bias), rounded once
    store_sums(out_ptr, bias_ptr, value, rm64, rm_ok, rn64, rn_ok, stride_om, stride_on, HAS_BIAS)


@triton.jit
def nvfp4_alpha_scalar_kernel(a_amax_ptr, b_amax_ptr, factor, alpha_ptr):
    tl.store(alpha_ptr, epilogue_alpha(a_amax_ptr, b_amax_ptr, factor))
