"""Tile arithmetic the launchers share: sides as powers of two, and the per-row-tile partial
column sums a kernel writes (`tile_io.store_column_sums`) and torch adds up."""

from __future__ import annotations

import torch


def pow2_at_least(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def partial_column_sums(
    column_sums: torch.Tensor | None, cols: int, tiles_r: int, device: torch.device
) -> torch.Tensor | None:
    """For `column_sums` (cols,) float32, checked here, the (cols, tiles_r) float32 buffer a
    kernel writes each row tile's column sums into (`tile_io.store_column_sums`; each column's
    partial sums contiguous); None without column sums."""
    if column_sums is None:
        return None
    if column_sums.shape != (cols,) or column_sums.dtype != torch.float32:
        raise ValueError(f"column_sums must be float32 of shape ({cols},)")
    return torch.empty((cols, tiles_r), dtype=torch.float32, device=device)


def add_column_sums(partial_sums: torch.Tensor | None, column_sums: torch.Tensor | None) -> None:
    """column_sums = the sum of the tiles' partial sums (summed in float32 over each tile's
    rows, then over the tiles)."""
    if partial_sums is not None:
        torch.sum(partial_sums, 1, out=column_sums)
