"""Bytes a quantization kernel moves: each operand read or written once.

A spec with one tensor scale (nvfp4, mxfp4-ue5m3) reads its input twice, once for the tensor
amax and once to quantize; the count here takes one read, so its GB/s is a lower bound on the
traffic. An outer block's scale (nvfp4-outer128) is found in the one pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp4cli.bench.configs import BenchConfig
from fp4cli.quant.blocking import BlockLayout

KERNELS = ("copy", "quantize", "fake-quantize", "dequantize")
# a two-level spec's two passes, timed apart on the kernels: the tensor amax (one read), and
# the quantization given the amax
TWO_LEVEL_KERNELS = ("tensor-amax", "quantize-given-amax")
# a 2-D tensor quantized along its rows and down its columns from one read (the quantized
# Linear's operand pairs), both directions packed
PAIR_KERNEL = "quantize-pair"
# each direction of the pair alone (`quantize_pair` with one direction, as the quantized Linear
# runs a direction that does not share a tile), to packed codes and to values in x's dtype
PAIR_DIRECTION_KERNELS = ("pair-rows", "pair-cols", "pair-rows-values", "pair-cols-values")
# a two-level spec's pair: its amax pass alone (`launch_pair.pair_amax_pass`, both directions'
# amaxes, transformed, from one read, and their encode tables); with the directions, each one's
PAIR_AMAX_KERNEL = "pair-amax"
PAIR_DIRECTION_AMAX_KERNELS = ("pair-rows-amax", "pair-cols-amax")


@dataclass(frozen=True)
class QuantTraffic:
    """Sizes in bytes of one tensor's operands.

    input: x in its dtype. codes: the element codes (two per byte for 4-bit elements) in the
    padded axis-last layout. scales: the block scales plus the tensor scale, if any. values: the
    dequantized tensor in x's dtype (the Hadamard-padded length when there is a transform).
    across: for a 2-D x, the codes and scales of x quantized along its other axis. rows, cols:
    for a 2-D x, (codes + scales, values) of x quantized along its rows and down its columns.
    """

    input: int
    codes: int
    scales: int
    values: int
    across: int = 0
    rows: tuple[int, int] = (0, 0)
    cols: tuple[int, int] = (0, 0)

    def kernel_bytes(self, kernel: str) -> int:
        """Bytes `kernel` reads plus bytes it writes."""
        moved = {
            "copy": 2 * self.input,
            "quantize": self.input + self.codes + self.scales,
            "fake-quantize": self.input + self.values,
            "dequantize": self.codes + self.scales + self.values,
            "tensor-amax": self.input,
            "quantize-given-amax": self.input + self.codes + self.scales,
            PAIR_KERNEL: self.input + self.codes + self.scales + self.across,
            "pair-rows": self.input + self.rows[0],
            "pair-cols": self.input + self.cols[0],
            "pair-rows-values": self.input + self.rows[1],
            "pair-cols-values": self.input + self.cols[1],
            PAIR_AMAX_KERNEL: self.input,
            **{kernel: self.input for kernel in PAIR_DIRECTION_AMAX_KERNELS},
        }
        return moved[kernel]


def quant_traffic(
    shape: tuple[int, ...], dtype: torch.dtype, axis: int, config: BenchConfig
) -> QuantTraffic:
    """The operand sizes of `shape` in `dtype` quantized along `axis` with `config`."""
    axis = axis % len(shape)
    codes, scales, moved_shape = _stored(shape, axis, config)
    directions = [(0, 0), (0, 0)]
    if len(shape) == 2:
        for along in (0, 1):  # down the columns, along the rows
            along_codes, along_scales, along_shape = _stored(shape, along, config)
            values = math.prod(along_shape) * dtype.itemsize
            directions[along] = (along_codes + along_scales, values)
    across = directions[1 - axis][0] if len(shape) == 2 else 0
    return QuantTraffic(
        input=math.prod(shape) * dtype.itemsize,
        codes=codes,
        scales=scales,
        values=math.prod(moved_shape) * dtype.itemsize,
        across=across,
        rows=directions[1],
        cols=directions[0],
    )


def _stored(
    shape: tuple[int, ...], axis: int, config: BenchConfig
) -> tuple[int, int, tuple[int, ...]]:
    """(code bytes, scale bytes, the axis-last shape) of `shape` quantized along `axis`."""
    spec = config.spec
    length = shape[axis]
    if config.hadamard:
        length = -(-length // config.hadamard) * config.hadamard
    moved_shape = (*shape[:axis], *shape[axis + 1 :], length)
    codes, scales = BlockLayout.for_tensor(moved_shape, spec).stored_bytes(spec)
    return codes, scales, moved_shape
