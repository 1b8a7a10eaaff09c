"""Outlier statistics of a tensor: the numbers that say whether clamping or a Hadamard transform
can pay off before any quantizer runs.

The tensor is read as a matrix x (rows, channels) = x.reshape(-1, x.shape[-1]). For an
activation the rows are tokens and the channels its features; for a weight (out, in) the rows
are output units and the channels its input features, the forward GEMM's reduction dimension,
along which the quantizers' blocks run.

- kurtosis: E[(x - mean)^4] / var^2 over every value (Pearson's: 3 for a Gaussian, 1.8 for a
  uniform; heavy tails raise it).
- row_ratio_max, row_ratio_p99: max |x| / median |x| of each row (token); the largest over the
  rows, and their 99th percentile (nearest rank). Rows whose median |x| is 0 are left out.
- col_ratio_max, col_ratio_p99: the same for each channel (column).
- one_value_blocks: by block size, the share of blocks (`block` consecutive values of a row, the
  last one zero-padded; blocks that are all zero left out) whose largest |x| is more than twice
  the second largest: one value sets the block's scale and pushes the rest towards zero.

A tensor holding NaN or Inf, or no value at all, has NaN statistics; a statistic with no row,
column or block to measure is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PERCENTILE = 0.99
ONE_VALUE_FACTOR = 2.0  # the largest |x| of a block over its second largest


@dataclass(frozen=True)
class OutlierStats:
    kurtosis: float
    row_ratio_max: float
    row_ratio_p99: float
    col_ratio_max: float
    col_ratio_p99: float
    one_value_blocks: dict[int, float]  # block size -> share of blocks


def outlier_stats(x: torch.Tensor, block_sizes: Sequence[int]) -> OutlierStats:
    """The statistics of `x` (any shape, read as (rows, channels)), with the one-value share
    for each of `block_sizes`."""
    if x.numel() == 0 or x.dim() == 0 or not torch.isfinite(x).all():
        nan = math.nan
        return OutlierStats(nan, nan, nan, nan, nan, {b: nan for b in block_sizes})
    matrix = x.detach().reshape(-1, x.shape[-1]).abs().to(torch.float32)  # (R, C)
    row_max, row_p99 = _peak_ratios(matrix, dim=1)
    col_max, col_p99 = _peak_ratios(matrix, dim=0)
    shares = {block: one_value_share(matrix, block) for block in block_sizes}
    return OutlierStats(kurtosis(x), row_max, row_p99, col_max, col_p99, shares)


def kurtosis(x: torch.Tensor) -> float:
    """Pearson's kurtosis of every value of x, in float64; NaN for a constant tensor."""
    values = x.detach().reshape(-1).to(torch.float64)
    centered = values - values.mean()
    variance = centered.square().mean()
    if variance == 0:
        return math.nan
    return float(centered.pow(4).mean() / variance.square())


def _peak_ratios(magnitudes: torch.Tensor, dim: int) -> tuple[float, float]:
    """(largest, 99th percentile) over the slices along `dim` of max |x| / median |x| (the
    lower middle value for an even count); slices with median 0 are left out."""
    peaks = magnitudes.amax(dim=dim)  # (slices,)
    medians = magnitudes.median(dim=dim).values  # (slices,)
    kept = medians > 0
    ratios = peaks[kept] / medians[kept]  # (kept slices,)
    if ratios.numel() == 0:
        return math.nan, math.nan
    rank = math.ceil(PERCENTILE * ratios.numel())  # nearest rank, 1-based
    return float(ratios.max()), float(ratios.kthvalue(rank).values)


def one_value_share(magnitudes: torch.Tensor, block: int) -> float:
    """Share of the non-zero blocks of `block` values along the channels of |x| (R, C) whose
    largest value is more than ONE_VALUE_FACTOR times the second largest."""
    if block < 2:
        return math.nan
    channels = magnitudes.shape[-1]
    padded = F.pad(magnitudes, (0, -channels % block))  # (R, C') with C' a multiple of block
    blocks = padded.reshape(padded.shape[0], -1, block)  # (R, C' / block, block)
    top = blocks.topk(2, dim=-1).values  # (R, C' / block, 2)
    largest, second = top[..., 0], top[..., 1]
    nonzero = largest > 0
    if not nonzero.any():
        return math.nan
    single = nonzero & (largest > ONE_VALUE_FACTOR * second)
    return float(single.sum() / nonzero.sum())
