"""Block layouts: how a tensor (quantization axis last) is cut into blocks that share a scale.

A layout pads the last axis (and, for 2-D tiles, the first) and views the tensor as
(*scale_shape, values_per_block). `scale_shape` is the shape of the scales tensor. A "column"
block holds every value at one position of the last axis (the view is a transpose: one block
per column, the lines in order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.quant.spec import QuantSpec, SpecError

if TYPE_CHECKING:
    import torch

TENSOR_SCALE_BYTES = 4  # the FP32 scale of a two-level (tensor-scaled) spec


@dataclass(frozen=True)
class BlockLayout:
    """Where the blocks of a (moved, axis-last) tensor of `moved_shape` lie."""

    kind: str  # "int", "row", "column", "tensor" or "tile2d"
    block: int  # values along the axis per block (tile side for tile2d)
    moved_shape: tuple[int, ...]  # the tensor with the quantization axis moved last
    padded_shape: tuple[int, ...]  # after padding

    @classmethod
    def for_tensor(cls, moved_shape: tuple[int, ...], spec: QuantSpec) -> BlockLayout:
        length = moved_shape[-1]
        pack = 2 if spec.packed else 1
        if spec.tile2d:
            if len(moved_shape) != 2:
                raise SpecError(f"tile2d: needs a 2-D tensor (got shape {tuple(moved_shape)})")
            block = int(spec.block)
            rows = round_up(moved_shape[0], block)
            return cls("tile2d", block, moved_shape, (rows, round_up(length, block)))
        if spec.block == "row":
            return cls("row", length, moved_shape, (*moved_shape[:-1], round_up(length, pack)))
        if spec.block == "tensor":
            return cls("tensor", length, moved_shape, (*moved_shape[:-1], round_up(length, pack)))
        if spec.block == "column":
            lines = math.prod(moved_shape[:-1])
            return cls("column", lines, moved_shape, (*moved_shape[:-1], round_up(length, pack)))
        block = int(spec.block)
        return cls("int", block, moved_shape, (*moved_shape[:-1], round_up(length, block)))

    @property
    def scale_count(self) -> int:
        """Block scales of the tensor: the element count of the scales tensor."""
        if self.kind == "tensor":
            return 1
        lines = math.prod(self.padded_shape[:-1])
        if self.kind == "row":
            return lines
        if self.kind == "column":
            return self.padded_shape[-1]
        if self.kind == "tile2d":
            return (self.padded_shape[0] // self.block) * (self.padded_shape[1] // self.block)
        return lines * (self.padded_shape[-1] // self.block)

    def stored_bytes(self, spec: QuantSpec) -> tuple[int, int]:
        """(codes, scales) bytes of the quantized tensor: the padded codes at the element's
        width, and the block scales plus the FP32 tensor scale of a two-level spec."""
        codes = -(-math.prod(self.padded_shape) * spec.element_format.bits // 8)
        scales = self.scale_count * spec.scale_format.storage_bytes
        if spec.outer_block:  # one FP32 scale per outer block of every line
            lines = math.prod(self.padded_shape[:-1])
            outer = lines * -(-self.padded_shape[-1] // spec.outer_block)
            return codes, scales + outer * TENSOR_SCALE_BYTES
        return codes, scales + (TENSOR_SCALE_BYTES if spec.tensor_scale else 0)

    def pad(self, moved: torch.Tensor) -> torch.Tensor:
        """Zero-pad a moved tensor to the padded shape."""
        import torch.nn.functional as F

        pad_last = self.padded_shape[-1] - self.moved_shape[-1]
        pad_first = self.padded_shape[0] - self.moved_shape[0] if self.kind == "tile2d" else 0
        if pad_last == 0 and pad_first == 0:
            return moved
        if self.kind == "tile2d":
            return F.pad(moved, (0, pad_last, 0, pad_first))
        return F.pad(moved, (0, pad_last))

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        slices = tuple(slice(0, n) for n in self.moved_shape)
        return padded[slices]

    def to_blocks(self, padded: torch.Tensor) -> torch.Tensor:
        """(*padded_shape) -> (*scale_shape, values_per_block)."""
        if self.kind == "int":
            return padded.reshape(*self.padded_shape[:-1], -1, self.block)
        if self.kind == "row":
            return padded.unsqueeze(-2)
        if self.kind == "tensor":
            return padded.reshape(1, -1)
        if self.kind == "column":
            return padded.reshape(-1, self.padded_shape[-1]).t()
        rows, cols = self.padded_shape
        b = self.block
        tiles = padded.reshape(rows // b, b, cols // b, b).permute(0, 2, 1, 3)
        return tiles.reshape(rows // b, cols // b, b * b)

    def from_blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        """Inverse of to_blocks."""
        if self.kind == "tile2d":
            rows, cols = self.padded_shape
            b = self.block
            tiles = blocks.reshape(rows // b, cols // b, b, b).permute(0, 2, 1, 3)
            return tiles.reshape(rows, cols)
        if self.kind == "column":
            return blocks.t().reshape(self.padded_shape)
        return blocks.reshape(self.padded_shape)


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple`."""
    return -(-n // multiple) * multiple


def transformed_length(length: int, hadamard: int | None) -> int:
    """A quantized axis's length: padded with zeros to whole Hadamard transforms, if any."""
    return round_up(length, hadamard) if hadamard else length
