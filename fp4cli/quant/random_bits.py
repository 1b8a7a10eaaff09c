"""Counter-based random numbers for stochastic rounding (Philox4x32-10).

The bits for element i of a tensor depend only on (seed, i): the same seed gives the same
rounding on any device, in any block order. One Philox call gives four 32-bit words, so four
consecutive elements share one: element i takes word (i mod 4) of Philox with counter
(i // 4 low, i // 4 high, 0, 0) and key (seed low, seed high). A Triton kernel calling
`tl.randint4x(seed, i // 4)` draws the very same words.
A uniform number in [0, 1) is the top 24 bits of the word times 2^-24, exact in float32. At 8
or 16 bits a word serves 4 or 2 elements instead (`carry_fields`).
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
N_ROUNDS = 10


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for a 32-bit constant a and uint32 values b (in int64)."""
    b_hi, b_lo = b >> 16, b & 0xFFFF
    low_part = a * b_lo  # < 2^48: no int64 overflow
    high_part = a * b_hi  # < 2^48
    hi = (high_part + (low_part >> 16)) >> 16
    lo = (((high_part & 0xFFFF) << 16) + low_part) & _MASK32
    return hi & _MASK32, lo


Seed = int | torch.Tensor  # a Python int or a 0-d int64 tensor (e.g. a module buffer)


def _key(seed: Seed) -> tuple[int | torch.Tensor, int | torch.Tensor]:
    """The two 32-bit key words (low, high) of a 64-bit seed."""
    if isinstance(seed, torch.Tensor):
        seed = seed.to(torch.int64)
        return seed & _MASK32, (seed >> 32) & _MASK32
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed & _MASK32, seed >> 32


@torch.compiler.disable
def philox4(seed: Seed, counters: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four 32-bit output words (int64 in [0, 2^32)) of Philox4x32-10 for each int64
    counter (counter words: low 32 bits, high 32 bits, 0, 0), keyed by `seed`.

    Runs eagerly under torch.compile: its ten rounds of 64-bit integer arithmetic make the
    compiler's graph grow without bound."""
    k0, k1 = _key(seed)
    counters = counters.to(torch.int64)
    c0 = counters & _MASK32
    c1 = (counters >> 32) & _MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(N_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def philox_bits(seed: Seed, offsets: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """32 random bits (int64 in [0, 2^32)) for each non-negative int64 offset: word
    (offset mod 4) of Philox for counter offset // 4.

    count: every offset is below it (a tensor's element indices, in any order or repeated).
    Philox then runs once for each counter below ceil(count / 4) and the offsets look their
    words up: a quarter of the calls of one per offset, the same bits."""
    offsets = offsets.to(torch.int64)
    if count is not None:
        counters = torch.arange(-(-count // 4), device=offsets.device, dtype=torch.int64)
        return torch.stack(philox4(seed, counters), dim=-1).flatten()[offsets]
    words = torch.stack(philox4(seed, offsets >> 2), dim=-1)
    return torch.gather(words, -1, (offsets & 3).unsqueeze(-1)).squeeze(-1)


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Uniform float32 in [0, 1) from 32-bit integers: the top 24 bits times 2^-24."""
    return (bits >> 8).to(torch.float32) * (2.0**-24)


def uniform(seed: Seed, offsets: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """Counter-based uniform numbers in [0, 1), one per offset (`philox_bits`' count: every
    offset below it)."""
    return uniform_from_bits(philox_bits(seed, offsets, count))


def carry_fields(seed: Seed, offsets: torch.Tensor, count: int | None, bits: int) -> torch.Tensor:
    """`bits` (8 or 16) random bits (int64) for each offset, for stochastic rounding by carry:
    offset i takes field (i mod per) of the word that `philox_bits` gives offset i // per, per
    = 32 / bits fields a word, the lowest field first. One Philox call serves 128 / bits
    offsets (16 at 8 bits)."""
    per = 32 // bits
    count_words = None if count is None else -(-count // per)
    words = philox_bits(seed, offsets // per, count_words)
    return (words >> ((offsets % per) * bits)) & ((1 << bits) - 1)


def uniform_at(
    seed: Seed, offsets: torch.Tensor, count: int | None = None, bits: int = 24
) -> torch.Tensor:
    """Uniform float32 in [0, 1) for each offset at a resolution of `bits` bits: 24 `uniform`'s,
    8 or 16 `carry_fields` times 2^-bits (exact)."""
    if bits == 24:
        return uniform(seed, offsets, count)
    return carry_fields(seed, offsets.to(torch.int64), count, bits).to(torch.float32) * (2.0**-bits)


def random_signs(seed: Seed, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """n random +-1 (float32) from the top bit of the counter-based bits for offsets 0..n-1."""
    bits = philox_bits(seed, torch.arange(n, device=device, dtype=torch.int64), n)
    return 1.0 - 2.0 * (bits >> 31).to(torch.float32)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A fresh 63-bit seed from torch's random state (so `torch.manual_seed` reproduces it)."""
    return int(torch.randint(0, 2**63 - 1, (1,), generator=generator).item())
