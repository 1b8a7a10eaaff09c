"""The random inputs a launch passes: stochastic rounding's and the Hadamard transform's seeds,
and the transform's compile-time constants.

A seed reaches a kernel as three arguments (`_seed_args`): a pointer to a one-element int64
tensor (or None), an int64 value added to it (or the seed itself), and the constexpr that says
whether the kernel reads the pointer (`tile_io.seed_of`).
"""

from __future__ import annotations

import torch

from fp4cli.quant.random_bits import Seed
from fp4cli.techniques.hadamard import FixedSigns, normalization

SeedOffset = tuple[torch.Tensor, int]  # a seed tensor and an offset the kernel adds to it


def _signed64(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def _seed_args(
    seed: Seed | SeedOffset | FixedSigns | None, device: torch.device
) -> tuple[torch.Tensor | None, int, bool]:
    """(pointer argument, value argument, whether the kernel reads the pointer). A
    (tensor, offset) pair is the seed tensor + offset, added in the kernel. Fixed Hadamard
    signs need no seed (they reach the kernel as a constexpr, `signs_constant`)."""
    if isinstance(seed, FixedSigns):
        return None, 0, False
    if isinstance(seed, tuple):
        tensor, offset = seed
        return _seed_pointer(tensor, device), _signed64(offset), True
    if isinstance(seed, torch.Tensor):
        return _seed_pointer(seed, device), 0, True
    return None, _signed64(int(seed or 0)), False


def _seed_pointer(seed: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A one-element int64 seed tensor on `device` (the kernels read its first element): the
    seed itself when it already is one, as a training step's is (no launch, no host time)."""
    if seed.dtype == torch.int64 and seed.device == device and seed.numel() == 1:
        return seed
    return seed.to(device=device, dtype=torch.int64).reshape(1)


def signs_constant(hadamard_seed: Seed | SeedOffset | FixedSigns | None) -> int:
    """A transform's HADAMARD_SIGNS (`tile_ops.negated_positions`): -1 for signs drawn from
    its seed, else the fixed signs' mask."""
    return hadamard_seed.flips if isinstance(hadamard_seed, FixedSigns) else -1


def hadamard_constants(hadamard: int | None, signs: int = -1) -> dict[str, object]:
    """The transform's constexprs: HADAMARD (its size, 0 without), LOG2_HADAMARD,
    HADAMARD_NORM (1 / sqrt(size)) and HADAMARD_SIGNS (`signs_constant`)."""
    if not hadamard:
        return dict(HADAMARD=0, LOG2_HADAMARD=0, HADAMARD_NORM=1.0, HADAMARD_SIGNS=-1)
    return dict(
        HADAMARD=hadamard,
        LOG2_HADAMARD=hadamard.bit_length() - 1,
        HADAMARD_NORM=normalization(hadamard),
        HADAMARD_SIGNS=signs,
    )
