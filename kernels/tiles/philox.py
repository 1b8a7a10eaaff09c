"""Philox4x32-10, the counter-based generator of stochastic rounding and the Hadamard signs
(`fp4cli.quant.random_bits` is its definition), for the kernels.

Each round multiplies two 32-bit state words by the round constants and keeps both halves of
each 64-bit product. Written as separate high and low multiplications (as `tl.randint4x` is),
that is two integer multiply instructions per product on Hopper; here one `mul.wide.u32`
gives both halves. Under the interpreter, which runs no inline assembly, the halves come from
`umulhi` and a wrapping multiplication: the same words either way.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.quant.backend import interpreter_on

ROUND_A = tl.constexpr(0xD2511F53)
ROUND_B = tl.constexpr(0xCD9E8D57)
KEY_A = tl.constexpr(0x9E3779B9)
KEY_B = tl.constexpr(0xBB67AE85)
ROUNDS = tl.constexpr(10)
WIDE_PRODUCTS = tl.constexpr(not interpreter_on())


@triton.jit
def _wide_product(x, CONSTANT: tl.constexpr):
    """(high, low) 32-bit halves of CONSTANT * x for uint32 x."""
    constant = tl.full(x.shape, CONSTANT, tl.uint32)
    if WIDE_PRODUCTS:
        high, low = tl.inline_asm_elementwise(
            "{ .reg .b64 p; mul.wide.u32 p, $2, $3; mov.b64 {$1, $0}, p; }",
            "=r,=r,r,r", [x, constant], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1,
        )  # fmt: skip
    else:
        high, low = tl.umulhi(x, constant), x * constant
    return high, low


@triton.jit
def philox_words(seed, counters):
    """The four uint32 output words of Philox4x32-10 keyed by the int64 seed (key: its low and
    high 32 bits) for each int64 counter (state: its low and high 32 bits, then two zeros):
    `tl.randint4x(seed, counters)`'s words."""
    seed = seed.to(tl.uint64, bitcast=True)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c0 = counters.to(tl.uint32)
    c1 = (counters >> 32).to(tl.uint32)
    # round 1, with c2 = c3 = 0: B * c2 is 0
    high_a, low_a = _wide_product(c0, ROUND_A)
    c0, c1, c2, c3 = c1 ^ k0, c1 * 0, high_a ^ k1, low_a
    for _ in tl.static_range(ROUNDS - 1):
        k0 = k0 + KEY_A
        k1 = k1 + KEY_B
        high_b, low_b = _wide_product(c2, ROUND_B)
        high_a, low_a = _wide_product(c0, ROUND_A)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
    return c0, c1, c2, c3
