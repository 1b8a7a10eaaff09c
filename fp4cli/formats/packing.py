"""Two 4-bit codes per byte: element 2i in the low nibble, element 2i+1 in the high nibble."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes (< 16) along the last dimension, whose length must be even."""
    import torch

    if codes.shape[-1] % 2:
        raise ValueError(f"cannot pack an odd number of codes ({codes.shape[-1]})")
    codes = codes.to(torch.uint8)
    low, high = codes[..., 0::2], codes[..., 1::2]
    return low | (high << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles: (..., n) bytes -> (..., 2n) codes."""
    import torch

    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)
