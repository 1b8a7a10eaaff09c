"""E2M1 codes to 8-bit GEMM operands, four elements per 32-bit word (SWAR: each byte of a
uint32 is one lane; no lane ever carries into the next).

A code word holds 8 E2M1 codes (4 bytes, low nibble first), all of one block. Each half word
becomes one output word of 4 bytes, in the codes' order. The block's scale is folded in as a
shift k >= 0 binades above the smallest the format holds exactly (k < 0 flushes the word):

  FORMAT_E5M2: q * 2^(k - 13), k in [0, 26]     (E5M2 bits: exponent field + 1 mantissa bit)
  FORMAT_E4M3: q * 2^(k - 5),  k in [0, 11]     (E4M3 bits, normal numbers only)
  FORMAT_INT8: q * 2 * 2^k,    k in [0, 3]      (two's complement; |value| <= 96)
"""

from __future__ import annotations

import triton
import triton.language as tl

FORMAT_NONE = tl.constexpr(0)
FORMAT_E5M2 = tl.constexpr(1)
FORMAT_E4M3 = tl.constexpr(2)
FORMAT_INT8 = tl.constexpr(3)
LANES_LOW = tl.constexpr(0x01010101)
LANES_MAG = tl.constexpr(0x07070707)
LANES_SIGN = tl.constexpr(0x08080808)
LANES_HIGH = tl.constexpr(0x80808080)


@triton.jit
def fold_range(FORMAT: tl.constexpr):
    """The largest shift k the format holds exactly (its binades below a row's top block)."""
    if FORMAT == FORMAT_E5M2:
        return 26
    if FORMAT == FORMAT_E4M3:
        return 11
    return 3


@triton.jit
def nibbles_to_lanes(half_word):
    """A uint32 whose low 16 bits hold 4 codes -> one code per byte lane, in order."""
    spread = (half_word | (half_word << 8)) & 0x00FF00FF
    return (spread | (spread << 4)) & 0x0F0F0F0F


@triton.jit
def lanes_to_format(codes, shift, FORMAT: tl.constexpr):
    """Byte lanes of E2M1 codes (uint32) and a shift k per word (int32) -> the format's bytes."""
    magnitude = codes & LANES_MAG
    sign = codes & LANES_SIGN
    at_least_2 = ((magnitude | (magnitude >> 1)) >> 1) & LANES_LOW
    nonzero = ((magnitude + 0x7F7F7F7F) & LANES_HIGH) >> 7
    k = tl.maximum(shift, 0).to(tl.uint32)
    if FORMAT == FORMAT_INT8:
        at_least_5 = ((magnitude + 0x03030303) >> 3) & LANES_LOW
        at_least_6 = ((magnitude + 0x02020202) >> 3) & LANES_LOW
        at_least_7 = ((magnitude + 0x01010101) >> 3) & LANES_LOW
        value = (magnitude + at_least_5 + at_least_6 + 3 * at_least_7) << k  # 2|q| 2^k
        negated = (LANES_HIGH - value) ^ LANES_HIGH  # 256 - value in each lane
        negative = (sign >> 3) * 0xFF
        out = value ^ ((value ^ negated) & negative)
    else:
        if FORMAT == FORMAT_E5M2:
            # exponent field + mantissa of q * 2^(k - 13): (m + [m >= 2]) * 2 + 4k + 2
            out = ((magnitude + at_least_2) << 1) + nonzero * ((k << 2) + 2)
        else:
            # E4M3 of q * 2^(k - 5): (m + [m >= 2]) * 4 + 8k + 4
            out = ((magnitude + at_least_2) << 2) + nonzero * ((k << 3) + 4)
        out = out | (sign << 4)
    return tl.where(shift >= 0, out, 0)


@triton.jit
def decode_words(code_words, shift, FORMAT: tl.constexpr):
    """[R, S, 4] uint32 code words (a 32-code window's 4 words in the last axis) and int32 shifts
    broadcast to them -> [R, S, 8] uint32 output words (4 bytes each), in the codes' order."""
    R: tl.constexpr = code_words.shape[0]
    S: tl.constexpr = code_words.shape[1]
    low = lanes_to_format(nibbles_to_lanes(code_words & 0xFFFF), shift, FORMAT)
    high = lanes_to_format(nibbles_to_lanes(code_words >> 16), shift, FORMAT)
    return tl.reshape(tl.join(low, high), (R, S, 8))
