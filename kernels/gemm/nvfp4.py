"""The NVFP4 GEMM kernel: packed E2M1 codes and E4M3 block-scale codes decoded in registers to
q * s (exact in bfloat16), multiplied on the tensor cores with float32 accumulation, and the
two tensors' decode scale alpha = fl32(amax_a * amax_b) / factor applied once in the epilogue
(`fp4cli.gemm.nvfp4` states the contract).

Decoding, per element, by bit arithmetic (no table, no division):

- an E2M1 code's three magnitude bits shifted onto bits 22-24 of a float32 (the exponent's
  low bits and the top mantissa bit), its sign bit onto bit 31: that float32 is q * 2^-126
  exactly (code 1, q = 0.5, lands on the subnormal 2^-127, which is why a shift works for
  every code). Codes are read as int32 words of 8: code J is shifted onto bits 28-31, then an
  arithmetic shift right by 6 carries its magnitude to 22-24 while bit 31 keeps its sign;
- an E4M3 scale code shifted likewise, its exponent rebiased by 120 + 118: s * 2^118 for
  normal codes; subnormal codes (exponent field 0) are fixed by one subtraction;
- one float32 product, exact: q * s * 2^-8 (between 2^-18 and 10.5, a normal bfloat16).

Three integer operations, one multiplication and half a conversion per element. The products
of two decoded values are q_a s_a q_b s_b 2^-16, between 2^-36 and 2^7: scaling every product
by a power of two inside float32's normal range changes no rounding of the accumulation, and
the epilogue multiplies by 2^16 (exact) before alpha.

A dot product does not depend on the order of K: the kernel multiplies code J of every word
of A against code J of every word of B, 8 dots of BK / 8 per K step, with no interleaving
(the 8 codes of a word lie in one block of 16, so a word has one scale). DECODE picks the
dot's input type: "bf16" (the tensor cores), "fp16" (as exact) or "fp32" (IEEE products: the
interpreter, whose bfloat16 rounds wrongly).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.gemm.io import tile_ids

E4M3_BIAS = tl.constexpr((120 + 118) << 23)  # float32's bias minus E4M3's, plus 118
E4M3_SUBNORMAL = tl.constexpr(2.0**111)  # E4M3's 2^-7 times 2^118
E4M3_MAX_CODE = tl.constexpr(0x7E)  # 448; codes above are NaN
E2M1_FLOAT_BITS = tl.constexpr(-0x7E400000)  # 0x81C00000 as int32: sign and 3 magnitude bits
VALUE_UNDO = tl.constexpr(256.0)  # decoded values are q * s / 256
PRODUCT_UNDO = tl.constexpr(65536.0)  # and their products q_a s_a q_b s_b / 2^16


@triton.jit
def e4m3_scale_2p118(code):
    """s * 2^118 (float32) of E4M3 scale codes (int32, 0..255); NaN above 0x7E."""
    normal = ((code << 20) + E4M3_BIAS).to(tl.float32, bitcast=True)  # (1 + m/8) 2^(e + 111)
    subnormal = (normal - E4M3_SUBNORMAL) * 2.0  # exponent field 0: m 2^-9, times 2^118
    value = tl.where(code < 8, subnormal, normal)
    return tl.where(code > E4M3_MAX_CODE, float("nan"), value)


@triton.jit
def to_dot_type(x, DECODE: tl.constexpr):
    if DECODE == "bf16":
        return x.to(tl.bfloat16)
    elif DECODE == "fp16":
        return x.to(tl.float16)
    else:
        return x


@triton.jit
def nibble_values(words, scale, J: tl.constexpr, DECODE: tl.constexpr):
    """q * s / VALUE_UNDO of nibble J (element J of 8) of [R, C] int32 code words, each word's
    block scale s * 2^118 in `scale` [R, C], in the DECODE type."""
    shifted = words << (28 - 4 * J)  # the nibble on bits 28-31
    # arithmetic shift: magnitude to bits 22-24, the sign copied down from bit 31
    bits = ((shifted >> 6) & E2M1_FLOAT_BITS).to(tl.float32, bitcast=True)
    return to_dot_type(bits * scale, DECODE)


@triton.jit
def load_operand(words_ptr, scales_ptr, rows64, k0, word_stride, scale_stride,
                 BK: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
    """[rows, BK / 8] code words (8 codes each, int32) and their block scales s * 2^118
    [rows, BK / 8] at K offset k0 (zero past K: code 0 with scale 0 is 0)."""
    R: tl.constexpr = rows64.shape[0]
    word = k0 // 8 + tl.arange(0, BK // 8)
    block = k0 // 16 + tl.arange(0, BK // 16)
    word_ptrs = words_ptr + rows64[:, None] * word_stride + word[None, :]
    scale_ptrs = scales_ptr + rows64[:, None] * scale_stride + block[None, :]
    if EVEN_K:
        words = tl.load(word_ptrs)
        codes = tl.load(scale_ptrs)
    else:
        words = tl.load(word_ptrs, mask=(word < word_stride)[None, :], other=0)
        codes = tl.load(scale_ptrs, mask=(block < scale_stride)[None, :], other=0)
    scale = e4m3_scale_2p118(codes.to(tl.int32))
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (R, BK // 16, 2)), (R, BK // 8))
    return words, scale


@triton.jit
def epilogue_alpha(amax_a_ptr, amax_b_ptr, factor):
    """alpha = fl32(fl32(amax_a * amax_b) / factor), correctly rounded."""
    return tl.div_rn(tl.load(amax_a_ptr) * tl.load(amax_b_ptr), factor)


@triton.jit
def nvfp4_fused_kernel(
    a_words_ptr, a_scales_ptr, a_amax_ptr, b_words_ptr, b_scales_ptr, b_amax_ptr, factor,
    out_ptr, M, N, k_padded, word_stride, scale_stride, stride_om, stride_on,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, DECODE: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tile_ids(M, N, BM, BN, GROUP_M)
    ra = pid_m * BM + tl.arange(0, BM)
    rb = pid_n * BN + tl.arange(0, BN)
    # rows past M (N) read row 0's data again; their outputs are not stored
    ra_load = tl.where(ra < M, ra, 0).to(tl.int64)
    rb_load = tl.where(rb < N, rb, 0).to(tl.int64)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, k_padded, BK):
        a_words, a_scale = load_operand(a_words_ptr, a_scales_ptr, ra_load, k0, word_stride,
                                        scale_stride, BK, EVEN_K)  # fmt: skip
        b_words, b_scale = load_operand(b_words_ptr, b_scales_ptr, rb_load, k0, word_stride,
                                        scale_stride, BK, EVEN_K)  # fmt: skip
        # element J of every word of A against element J of every word of B: the dot is a
        # sum over K, in any order
        for j in tl.static_range(8):
            a = nibble_values(a_words, a_scale, j, DECODE)
            b = nibble_values(b_words, b_scale, j, DECODE)
            if DECODE == "fp32":
                acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(b), acc)
    value = (acc * PRODUCT_UNDO) * epilogue_alpha(a_amax_ptr, b_amax_ptr, factor)
    out = out_ptr + ra.to(tl.int64)[:, None] * stride_om + rb.to(tl.int64)[None, :] * stride_on
    tl.store(out, value.to(out_ptr.dtype.element_ty), mask=(ra < M)[:, None] & (rb < N)[None, :])
