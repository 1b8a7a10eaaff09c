"""The exact MXFP4 GEMM's step for tiles with a row beyond E5M2's fold range (`gemm.prep` flag
2): a nonzero block more than 26 binades below its row's largest, which no common fold holds.

Each 32-element window of K is decoded unfolded (q * 2^13 in E5M2), multiplied on the FP8
tensor cores (one window's products sum exactly), and its partial sum scaled by the window's
two block scales into the float32 accumulator: one scaling per window and output, slower than
the folded kernels, so `gemm.fp8` takes this path only for the tiles that need it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.io import load_codes
from fp4cli.kernels.gemm.tiles import FOLD_RANGE, FP8_TOP, decode_e5m2, scale_outer


@triton.jit
def window_product(a_codes_ptr, a_scales_ptr, b_codes_ptr, b_scales_ptr, ra64, ra_ok, rb64,
                   rb_ok, k0, k_padded, BLOCK: tl.constexpr):  # fmt: skip
    """One 32-element window of A's rows ra and B's rows rb, decoded unfolded (q * 2^13),
    multiplied exactly, and scaled by the window's two block scales."""
    a_codes = load_codes(a_codes_ptr, ra64, ra_ok, k0, k_padded, 32)
    b_codes = load_codes(b_codes_ptr, rb64, rb_ok, k0, k_padded, 32)
    a = decode_e5m2(a_codes, tl.full(a_codes.shape, FOLD_RANGE, tl.int32))
    b = decode_e5m2(b_codes, tl.full(b_codes.shape, FOLD_RANGE, tl.int32))
    partial = tl.dot(a, tl.trans(b))  # one window: exact
    n_blocks = k_padded // BLOCK
    scale_a = tl.load(a_scales_ptr + ra64 * n_blocks + k0 // BLOCK, mask=ra_ok, other=0)
    scale_b = tl.load(b_scales_ptr + rb64 * n_blocks + k0 // BLOCK, mask=rb_ok, other=0)
    exponent_a = scale_a.to(tl.int32) - 127 - FP8_TOP
    exponent_b = scale_b.to(tl.int32) - 127 - FP8_TOP
    return scale_outer(partial, exponent_a, exponent_b)
