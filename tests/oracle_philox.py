"""The oracle's stochastic-rounding bits (`tests.oracle`), written from Random123's
Philox4x32-10, not from fp4cli. Elements 4 i to 4 i + 3 share the call with counter
(i lo, i hi, 0, 0) and key (seed lo, seed hi); element 4 i + j takes word j, and its uniform
number is (word >> 8) * 2^-24."""

from __future__ import annotations

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter: tuple[np.ndarray, ...], key: tuple[int, int]) -> list[np.ndarray]:
    c = [np.asarray(w, dtype=np.uint64) & _LOW32 for w in counter]
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    for round_index in range(10):
        if round_index:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0 = _M0 * c[0]  # < 2^64: no wrap-around
        p1 = _M1 * c[2]
        c = [
            (p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0),
            p1 & _LOW32,
            (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
            p0 & _LOW32,
        ]
    return c


def sr_uniform(seed: int, index: np.ndarray) -> np.ndarray:
    """The uniform number in [0, 1) of each element index (row-major index in x)."""
    index = np.asarray(index, dtype=np.uint64)
    counter = index >> np.uint64(2)  # four elements share one Philox call
    zero = np.zeros_like(index)
    seed &= (1 << 64) - 1
    words = philox4x32_10(
        (counter & _LOW32, counter >> np.uint64(32), zero, zero), (seed & 0xFFFFFFFF, seed >> 32)
    )
    lane = (index & np.uint64(3)).astype(np.int64)
    word = np.choose(lane, words)
    return (word >> np.uint64(8)).astype(np.float64) * 2.0**-24
