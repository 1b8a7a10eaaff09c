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
`random: false` with `signs: [...]` (sizes 16 and 32) fixes D once instead: the same signed
rotation at every call, as TransformerEngine's NVFP4 recipe rotates its weight-gradient
operands (`TE_SIGNS_16`). Either way the transform's signs reach the quantizers as `FixedSigns`
where a random transform passes its seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, TypeVar

from fp4cli.formats import float32
from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch

    from fp4cli.quant.random_bits import Seed

SIZES = (16, 32, 64, 128, 256)
SignSeed = TypeVar("SignSeed")  # however a caller passes its seed (an int, a tensor, ...)
FIXED_SIGN_SIZES = (16, 32)  # a fixed sign vector fits the kernels' 32-bit mask
# TransformerEngine's fixed signs for its 16-point weight-gradient transform (its
# `get_wgrad_sign_vector`), R = diag(signs) H_16, the same D H_n as here.
TE_SIGNS_16 = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


@dataclass(frozen=True)
class FixedSigns:
    """A transform's signs fixed for every call, given where a random transform's seed goes:
    bit j of `flips` set where position j is negated (0: no signs)."""

    flips: int = 0

    @classmethod
    def of(cls, signs: tuple[int, ...]) -> FixedSigns:
        return cls(sum(1 << j for j, sign in enumerate(signs) if sign < 0))

    def vector(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The n signs as float32 +-1."""
        import torch

        # the mask as a Python int: no host-to-device copy (a CUDA graph's capture refuses one)
        positions = torch.arange(n, device=device, dtype=torch.int64).clamp(max=63)
        return 1.0 - 2.0 * ((self.flips >> positions) & 1).to(torch.float32)


@dataclass(frozen=True)
class HadamardConfig:
    size: int = 64
    # False: no random signs (deterministic). Left out of a resolved recipe while true, so
    # recipes (and sweep points) from before the option keep their resolved form.
    random: bool = field(default=True, metadata={"omit_default": True})
    # A fixed sign per position (size of them, each 1 or -1), with random: false; None: none.
    signs: tuple[int, ...] | None = field(default=None, metadata={"omit_default": True})

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or self.size not in SIZES:
            raise SpecError(
                f"size: must be one of {', '.join(map(str, SIZES))} (got {self.size!r})"
            )
        if not isinstance(self.random, bool):
            raise SpecError(f"random: must be true or false (got {self.random!r})")
        if self.signs is not None:
            object.__setattr__(self, "signs", _checked_signs(self.signs, self.size, self.random))

    def sign_source(self, seed: SignSeed) -> SignSeed | FixedSigns:
        """What the quantizers draw this transform's signs from in a call with this `seed`:
        the seed itself for random signs, else the fixed signs."""
        return seed if self.random else _fixed_signs(self.signs)

    @property
    def kind(self) -> str:
        """rht (random signs), fht (fixed signs) or dht (deterministic: none)."""
        return "rht" if self.random else "fht" if self.signs is not None else "dht"


@cache
def _fixed_signs(signs: tuple[int, ...] | None) -> FixedSigns:
    """A config's fixed signs (none without a vector), made once: every training call asks."""
    return FixedSigns.of(signs) if signs is not None else FixedSigns()


def _checked_signs(signs: object, size: int, random: bool) -> tuple[int, ...]:
    if random:
        raise SpecError(
            "signs: a fixed sign vector replaces the random signs: set random: false, or drop "
            "the signs (signs: null)"
        )
    if size not in FIXED_SIGN_SIZES:
        sizes = " or ".join(map(str, FIXED_SIGN_SIZES))
        raise SpecError(f"signs: fixed signs are supported for size {sizes} (got size {size})")
    if not isinstance(signs, (list, tuple)) or len(signs) != size:
        raise SpecError(f"signs: must be a list of {size} signs, each 1 or -1 (got {signs!r})")
    if not all(sign in (1, -1) and not isinstance(sign, bool) for sign in signs):
        raise SpecError(f"signs: each sign must be 1 or -1 (got {list(signs)!r})")
    return tuple(int(sign) for sign in signs)


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


def sign_vector(
    seed: Seed | FixedSigns, n: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """D's n signs (float32 +-1): drawn from a seed, or fixed."""
    from fp4cli.quant.random_bits import random_signs

    if isinstance(seed, FixedSigns):
        return seed.vector(n, device)
    return random_signs(seed, n, device)


def rht_matrix(n: int, seed: Seed | FixedSigns, device: torch.device | str = "cpu") -> torch.Tensor:
    """The n x n block of R: D H_n (rows scaled by the signs drawn from `seed`, or fixed)."""
    return sign_vector(seed, n, device).unsqueeze(1) * hadamard_matrix(n, device)


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


def rht(x: torch.Tensor, dim: int, size: int, seed: Seed | FixedSigns | None) -> torch.Tensor:
    """x transformed along `dim` by R (padded to a multiple of `size`), in float32; seed None
    or FixedSigns(0): no signs (the deterministic transform); FixedSigns: those signs.

    The result's `dim` has the padded length; apply the same call (same size and seed) to both
    operands of a GEMM along its reduction dimension.
    """
    import torch
    import torch.nn.functional as F

    moved = x.to(torch.float32).movedim(dim, -1)
    length = moved.shape[-1]
    padded_length = -(-length // size) * size
    if padded_length != length:
        moved = F.pad(moved, (0, padded_length - length))
    blocks = moved.reshape(*moved.shape[:-1], padded_length // size, size)
    if seed is None or (isinstance(seed, FixedSigns) and seed.flips == 0):
        signed = blocks
    else:
        signed = blocks * sign_vector(seed, size, x.device)
    transformed = fwht(signed) * normalization(size)
    return transformed.reshape(*moved.shape[:-1], padded_length).movedim(-1, dim)


def inverse_rht(
    y: torch.Tensor, dim: int, size: int, seed: Seed | FixedSigns | None, length: int
) -> torch.Tensor:
    """`rht`'s transform undone along `dim` (R^T: H_n, then the signs, as R = D H_n with H_n
    symmetric), cut back to the first `length` positions (the padding dropped); float32. y's
    `dim` is a multiple of `size`: an operand transformed by `rht`, or a gradient of one."""
    import torch

    moved = y.to(torch.float32).movedim(dim, -1)
    padded_length = moved.shape[-1]
    blocks = moved.reshape(*moved.shape[:-1], padded_length // size, size)
    restored = fwht(blocks) * normalization(size)
    if not (seed is None or (isinstance(seed, FixedSigns) and seed.flips == 0)):
        restored = restored * sign_vector(seed, size, y.device)
    flat = restored.reshape(*moved.shape[:-1], padded_length)
    return flat[..., :length].movedim(-1, dim)
