"""Register-tile steps of the MXFP4 GEMM kernels: E2M1 codes to FP8 E5M2 with a block's scale
folded in, E2M1 codes to float values, and multiplication by powers of two far outside
float32's exponent range.

Why E5M2: an E2M1 value q (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}) times 2^j is an E5M2 number exactly
for j in [-13, 13] (q has one mantissa bit; E5M2 has two and float16's exponent range). The
GEMM maps a row's largest block scale to 2^13 and every block of the row to
q * 2^(13 - d), d binades below it: exact for d <= FOLD_RANGE = 26, where E4M3 would reach 11.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_ops import e8m0_scale, pow2, signed_e2m1_value

FOLD_RANGE = tl.constexpr(26)  # binades below the row's largest block scale folded exactly
FP8_TOP = tl.constexpr(13)  # the largest block's values are q * 2^13 (6 * 2^13 = 49152)
E8M0_NAN = tl.constexpr(255)


@triton.jit
def e5m2_bits(nibble, shift):
    """E5M2 bit patterns (int32, 0..255) of E2M1 codes (int32, 0..15) times 2^(shift - 13):
    exact for shift in [0, 26]; +-0 for shift < 0 (flushed)."""
    magnitude = nibble & 7
    # E5M2 exponent field and mantissa of q * 2^-13, as (field << 2 | mantissa) >> 1:
    # 0.5 -> 2, 1 -> 4, 1.5 -> 5, 2 -> 6, 3 -> 7, 4 -> 8, 6 -> 9.
    half = tl.where(magnitude >= 2, magnitude + 2, magnitude << 1)
    bits = (half << 1) + (shift << 2)
    bits = tl.where((magnitude == 0) | (shift < 0), 0, bits)
    return bits | ((nibble & 8) << 4)


@triton.jit
def decode_e5m2(codes, shift):
    """[R, C] packed codes (uint8, low nibble first) and [R, C] int32 shifts (one per byte) ->
    [R, 2C] float8e5 values q * 2^(shift - 13), in the codes' element order."""
    R: tl.constexpr = codes.shape[0]
    C: tl.constexpr = codes.shape[1]
    packed = codes.to(tl.int32)
    low = e5m2_bits(packed & 15, shift)
    high = e5m2_bits(packed >> 4, shift)
    bits = tl.reshape(tl.join(low, high), (R, 2 * C))
    return bits.to(tl.uint8).to(tl.float8e5, bitcast=True)


@triton.jit
def per_byte(window_values, BYTES: tl.constexpr):
    """[R, W] values, one per 32-element window -> [R, W * BYTES] (each repeated over the
    window's BYTES = 16 packed bytes)."""
    R: tl.constexpr = window_values.shape[0]
    W: tl.constexpr = window_values.shape[1]
    spread = tl.broadcast_to(window_values[:, :, None], (R, W, BYTES))
    return tl.reshape(spread, (R, W * BYTES))


@triton.jit
def decode_float(codes, scale_codes):
    """[R, C] packed codes and [R, C] E8M0 scale codes (one per byte) -> [R, 2C] float32
    values q * 2^(code - 127), NaN where the code is 255: exactly the reference dequantize."""
    R: tl.constexpr = codes.shape[0]
    C: tl.constexpr = codes.shape[1]
    packed = codes.to(tl.int32)
    scale, finite = e8m0_scale(scale_codes)
    low = signed_e2m1_value(packed & 15) * scale
    high = signed_e2m1_value(packed >> 4) * scale
    low = tl.where(finite, low, float("nan"))
    high = tl.where(finite, high, float("nan"))
    return tl.reshape(tl.join(low, high), (R, 2 * C))


@triton.jit
def scale_outer(x, exponent_rows, exponent_cols):
    """x[i, j] * 2^(exponent_rows[i] + exponent_cols[j]) for int32 exponents in [-149, 127]:
    exact whenever the result is a normal float32. The exponent is applied in two halves, each
    an outer product of two powers of two (exact), so an intermediate lies between x and the
    result."""
    high_rows = exponent_rows >> 1
    high_cols = exponent_cols >> 1
    high = pow2(high_rows)[:, None] * pow2(high_cols)[None, :]
    low = pow2(exponent_rows - high_rows)[:, None] * pow2(exponent_cols - high_cols)[None, :]
    return x * high * low
