"""Tile arithmetic the launchers share: sides as powers of two, and the per-row-tile partial
column sums a kernel writes (`tile_io.store_column_sums`) and torch or the gradients launch
adds up."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def pow2_at_least(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


@dataclass
class ColumnSums:
    """A tensor's float32 column sums left unadded: `partials` holds each column's partial sums
    contiguous, (cols, tiles) as a kernel's row tiles wrote them, or (cols,) complete. The
    launcher that reads the tensor sets them (`partial_column_sums`, or `sum_columns`); the
    gradients launch adds them up (`kernels.elementwise.gradients.widen_gradients`), so that the
    bias gradient takes no reduction of its own."""

    cols: int
    partials: torch.Tensor | None = None

    @property
    def tiles(self) -> int:
        """Partial sums per column (1: complete)."""
        if self.partials is None:
            raise ValueError("no launcher has written these column sums yet")
        return self.partials.numel() // self.cols

    def sum_columns(self, tensor: torch.Tensor) -> None:
        """The sums of a 2-D tensor's columns, complete, by torch."""
        self.partials = torch.sum(tensor, 0, dtype=torch.float32)


def partial_column_sums(
    column_sums: torch.Tensor | ColumnSums | None, cols: int, tiles_r: int, device: torch.device
) -> torch.Tensor | None:
    """For `column_sums` (cols,) float32, checked here, or a ColumnSums of `cols`, the
    (cols, tiles_r) float32 buffer a kernel writes each row tile's column sums into
    (`tile_io.store_column_sums`; each column's partial sums contiguous); None without column
    sums. A ColumnSums keeps the buffer as its partials."""
    if column_sums is None:
        return None
    if isinstance(column_sums, ColumnSums):
        if column_sums.cols != cols:
            raise ValueError(f"column sums of {column_sums.cols} columns for {cols}")
        column_sums.partials = torch.empty((cols, tiles_r), dtype=torch.float32, device=device)
        return column_sums.partials
    if column_sums.shape != (cols,) or column_sums.dtype != torch.float32:
        raise ValueError(f"column_sums must be float32 of shape ({cols},)")
    return torch.empty((cols, tiles_r), dtype=torch.float32, device=device)


def add_column_sums(
    partial_sums: torch.Tensor | None, column_sums: torch.Tensor | ColumnSums | None
) -> None:
    """column_sums = the sum of the tiles' partial sums (summed in float32 over each tile's
    rows, then over the tiles); a ColumnSums is left for the gradients launch to add."""
    if partial_sums is not None and not isinstance(column_sums, ColumnSums):
        torch.sum(partial_sums, 1, out=column_sums)
