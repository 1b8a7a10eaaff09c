"""Random Hadamard transform (RHT) along a GEMM's reduction dimension (Tseng et al.).

R = blockdiag(H_n D): H_n the normalized Sylvester Hadamard matrix of size n, D a diagonal of
random signs drawn from a seed, fresh for every GEMM call. R is orthogonal, so transforming both
operands along the reduction dimension leaves the product unchanged: (A R)(B R)^T = A B^T. The
dimension is zero-padded to a multiple of n (zeros add nothing to the product).

The transform is computed, here and in the Triton kernels, in one fixed float32 order so that
every backend gives the same bits: signs first (exact), then the butterfly stages h = 1, 2, 4,
.., n/2 (each pair (a, b) at distance h becomes (a + b, a - b)), then one multiplication by the
float32 constant 1/sqrt(n).

`random: false` drops the signs: the plain normalized Hadamard matrix, the same rotation at every
call (a deterministic Hadamard transform, which the MXFP4-on-MI355X study found to stabilize a
quantized weight-gradient GEMM where random rotations and stochastic rounding did not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from fp4cli.formats import float32
from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch

    from fp4cli.quant.random_bits import Seed

SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class HadamardConfig:
    size: int = 64
    # False: no random signs (deterministic). Left out of a resolved recipe while true, so
    # recipes (and sweep points) from before the option keep their resolved form.
    random: bool = field(default=True, metadata={"omit_default": True})

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or self.size not in SIZES:
            raise SpecError(
                f"size: must be one of {', '.join(map(str, SIZES))} (got {self.size!r})"
            )
        if not isinstance(self.random, bool):
            raise SpecError(f"random: must be true or false (got {self.random!r})")


@cache
def _sylvester(n: int) -> torch.Tensor:
    import torch

    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def hadamard_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix of size n (float32, orthogonal, symmetric)."""
    import torch

    if n not in SIZES:
        raise SpecError(f"Hadamard size must be one of {SIZES} (got {n})")
    return (_sylvester(n) / n**0.5).to(device=device, dtype=torch.float32)


def rht_matrix(n: int, seed: Seed, device: torch.device | str = "cpu") -> torch.Tensor:
    """The n x n block of R: D H_n (rows scaled by random signs drawn from `seed`)."""
    from fp4cli.quant.random_bits import random_signs

    return random_signs(seed, n, device).unsqueeze(1) * hadamard_matrix(n, device)


def normalization(n: int) -> float:
    """1/sqrt(n) rounded to float32 (exact for n = 16, 64, 256)."""
    return float32(1.0 / n**0.5)


def fwht(blocks: torch.Tensor) -> torch.Tensor:
    """The unnormalized Walsh-Hadamard transform of the last dimension (a power of two) of
    float32 `blocks`, in the butterfly order h = 1, 2, 4, ... (the order every backend uses)."""
    import torch

    n = blocks.shape[-1]
    h = 1
    while h < n:
        pairs = blocks.reshape(*blocks.shape[:-1], n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        blocks = torch.stack((a + b, a - b), dim=-2).reshape(*blocks.shape[:-1], n)
        h *= 2
    return blocks


def rht(x: torch.Tensor, dim: int, size: int, seed: Seed | None) -> torch.Tensor:
    """x transformed along `dim` by R (padded to a multiple of `size`), in float32; seed None:
    no signs (the deterministic transform).

    The result's `dim` has the padded length; apply the same call (same size and seed) to both
    operands of a GEMM along its reduction dimension.
    """
    import torch
    import torch.nn.functional as F

    from fp4cli.quant.random_bits import random_signs

    moved = x.to(torch.float32).movedim(dim, -1)
    length = moved.shape[-1]
    padded_length = -(-length // size) * size
    if padded_length != length:
        moved = F.pad(moved, (0, padded_length - length))
    blocks = moved.reshape(*moved.shape[:-1], padded_length // size, size)
    signed = blocks * random_signs(seed, size, x.device) if seed is not None else blocks
    transformed = fwht(signed) * normalization(size)
    return transformed.reshape(*moved.shape[:-1], padded_length).movedim(-1, dim)
