"""The kernels' Philox4x32-10 (`fp4cli.kernels.tiles.philox`: one wide multiplication per
product on a GPU, two under the interpreter) against the definition,
`fp4cli.quant.random_bits.philox4`, word for word: seeds of every sign and size, counters past
2^32 and near 2^63 (interpreter on the CPU, or a GPU)."""

import pytest
import torch

from fp4cli.quant.random_bits import philox4
from tests.kernel_cases import on_device

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
philox = pytest.importorskip("fp4cli.kernels.tiles.philox")

N = 64


@triton.jit
def _words_kernel(seed_ptr, counters_ptr, words_ptr, N: tl.constexpr):
    positions = tl.arange(0, N)
    w0, w1, w2, w3 = philox.philox_words(tl.load(seed_ptr), tl.load(counters_ptr + positions))
    tl.store(words_ptr + positions, w0.to(tl.int64))
    tl.store(words_ptr + N + positions, w1.to(tl.int64))
    tl.store(words_ptr + 2 * N + positions, w2.to(tl.int64))
    tl.store(words_ptr + 3 * N + positions, w3.to(tl.int64))


def _counters() -> torch.Tensor:
    edges = [0, 1, 2, 3, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**62, 2**63 - 1]
    spread = torch.randint(0, 2**62, (N - len(edges),), generator=torch.Generator().manual_seed(0))
    return torch.cat([torch.tensor(edges), spread])


@pytest.mark.parametrize("seed", [0, 1, 7, 2**32 - 1, 2**32, 2**62 + 9, 2**63 - 1, -1, -(2**63)])
def test_the_kernels_philox_words_are_the_definitions(seed):
    counters = _counters()
    words = on_device(torch.empty(4 * N, dtype=torch.int64))
    seed_tensor = on_device(torch.tensor([seed], dtype=torch.int64))
    _words_kernel[(1,)](seed_tensor, on_device(counters), words, N=N)
    # the uint32 words, widened with their sign: mask back to [0, 2^32)
    got = words.cpu().reshape(4, N) & 0xFFFFFFFF
    expected = torch.stack(philox4(torch.tensor(seed, dtype=torch.int64), counters))
    assert torch.equal(got, expected)
