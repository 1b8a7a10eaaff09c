"""Where the exact MXFP4 GEMM splits K: the few 32-wide windows whose blocks sit far above the
rest of their rows (activation outlier channels) go to the FP8 tier, the rest to INT8.

An outlier channel lifts its blocks' scales about 2^8 above the rest of every row, so whole rows
span more than INT8's 4 binades and every tile would take the FP8 tier. The split moves those
windows out of INT8's segment instead. The rule (`outlier_columns`, the definition the kernel
follows): a block column of an operand (a block position along K) is an outlier column when the
mean scale code of SAMPLE_ROWS of its rows (all rows if fewer; else rows i * rows // SAMPLE_ROWS,
evenly spaced), rounded down, exceeds the median column's by more than OUTLIER_BINADES. Outlier
channels are the same channels in every token, so a sample finds them. Both operands' outlier
columns form one set (the two must pair the same K positions); its windows come first in the
staged order, the rest after, each in K order.

One launch makes the choice on the device, with no host synchronisation: it only decides where
the work goes. Whatever it picks, the product is exact (`gemm.prep` flags every row its tiers
cannot hold, and those tiles take the FP8 kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch

OUTLIER_BINADES = 2
SAMPLE_ROWS = 64
HI_STEP = 2  # the FP8 segment is read 64 wide: its length is rounded up to 2 windows
SAMPLE_STEP = 32  # sampled rows per load
CHUNK = 256  # columns or windows per step
SPLIT_WARPS = 4


@dataclass(frozen=True)
class KSplit:
    """source (K / 32,) int32: the K window each staged slot holds (FP8 segment first);
    lo_start (1,) int32: the first slot of the INT8 segment (even)."""

    source: torch.Tensor
    lo_start: torch.Tensor


def sampled_rows(rows: int) -> torch.Tensor:
    """The rows whose scale codes the rule reads."""
    count = min(rows, SAMPLE_ROWS)
    return torch.arange(count, dtype=torch.int64) * rows // count


def outlier_columns(scales: torch.Tensor) -> torch.Tensor:
    """(blocks,) bool: the rule, on one operand's (rows, blocks) scale codes."""
    sample = scales[sampled_rows(scales.shape[0]).to(scales.device)]
    means = sample.sum(0, dtype=torch.int32) // sample.shape[0]
    return means > means.median() + OUTLIER_BINADES


@torch.compiler.disable
def k_split(scales_a: torch.Tensor, scales_b: torch.Tensor, block: int) -> KSplit:
    """The split of K for operands with these (rows, K / block) scale codes: one launch."""
    (rows_a, n_blocks), rows_b = scales_a.shape, scales_b.shape[0]
    device = scales_a.device
    means = torch.empty(2, n_blocks, dtype=torch.int32, device=device)  # the kernel's scratch
    n_windows = n_blocks * block // 32
    source = torch.empty(n_windows, dtype=torch.int32, device=device)
    lo_start = torch.empty(1, dtype=torch.int32, device=device)
    launch(
        k_split_kernel, (1,),
        (scales_a, scales_b, means, source, lo_start, rows_a, rows_b, n_blocks, n_windows),
        dict(BLOCK=block, SAMPLE=SAMPLE_ROWS, SAMPLE_STEP=SAMPLE_STEP, CHUNK=CHUNK,
             BINADES=OUTLIER_BINADES, STEP=HI_STEP),
        num_warps=SPLIT_WARPS,
    )  # fmt: skip
    return KSplit(source, lo_start)


@triton.jit
def store_column_means(scales_ptr, means_ptr, rows, n_blocks, SAMPLE: tl.constexpr,
                       SAMPLE_STEP: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """Each column's mean scale code over the sampled rows (rounded down), stored."""
    count = tl.minimum(rows, SAMPLE)
    for c0 in range(0, n_blocks, CHUNK):
        column = c0 + tl.arange(0, CHUNK)
        column_ok = column < n_blocks
        total = tl.zeros([CHUNK], tl.int32)
        for i0 in range(0, count, SAMPLE_STEP):
            i = i0 + tl.arange(0, SAMPLE_STEP)
            row = i.to(tl.int64) * rows // count
            mask = (i < count)[:, None] & column_ok[None, :]
            codes = tl.load(scales_ptr + row[:, None] * n_blocks + column[None, :], mask=mask,
                            other=0)  # fmt: skip
            total += tl.sum(codes.to(tl.int32), axis=0)
        tl.store(means_ptr + column, total // count, mask=column_ok)


@triton.jit
def lower_median(means_ptr, n_blocks, CHUNK: tl.constexpr):
    """The lower median of n_blocks int32 values in [0, 255]: the least v with at least
    (n_blocks + 1) // 2 values <= v, counted for every v at once."""
    value = tl.arange(0, 256)
    at_most = tl.zeros([256], tl.int32)
    for c0 in range(0, n_blocks, CHUNK):
        column = c0 + tl.arange(0, CHUNK)
        means = tl.load(means_ptr + column, mask=column < n_blocks, other=256)
        at_most += tl.sum((means[None, :] <= value[:, None]).to(tl.int32), axis=1)
    return tl.min(tl.where(at_most >= (n_blocks + 1) // 2, value, 256), axis=0)


@triton.jit
def window_is_outlier(means_ptr, window, window_ok, median_a, median_b, n_blocks,
                      BLOCK: tl.constexpr, BINADES: tl.constexpr):  # fmt: skip
    block = window * 32 // BLOCK
    mean_a = tl.load(means_ptr + block, mask=window_ok, other=0)
    mean_b = tl.load(means_ptr + n_blocks + block, mask=window_ok, other=0)
    return ((mean_a > median_a + BINADES) | (mean_b > median_b + BINADES)) & window_ok


@triton.jit
def k_split_kernel(a_scales_ptr, b_scales_ptr, means_ptr, source_ptr, lo_start_ptr, rows_a,
                   rows_b, n_blocks, n_windows, BLOCK: tl.constexpr, SAMPLE: tl.constexpr,
                   SAMPLE_STEP: tl.constexpr, CHUNK: tl.constexpr, BINADES: tl.constexpr,
                   STEP: tl.constexpr):  # fmt: skip
    """One program: both operands' column means (into the (2, n_blocks) scratch), their
    medians, then the windows' staged order (outlier windows first) and the INT8 segment's
    first slot, rounded up to STEP."""
    store_column_means(a_scales_ptr, means_ptr, rows_a, n_blocks, SAMPLE, SAMPLE_STEP, CHUNK)
    store_column_means(b_scales_ptr, means_ptr + n_blocks, rows_b, n_blocks, SAMPLE,
                       SAMPLE_STEP, CHUNK)  # fmt: skip
    tl.debug_barrier()  # the means, stored by all of the program's threads, read back
    median_a = lower_median(means_ptr, n_blocks, CHUNK)
    median_b = lower_median(means_ptr + n_blocks, n_blocks, CHUNK)
    n_outlier = 0
    for w0 in range(0, n_windows, CHUNK):
        window = w0 + tl.arange(0, CHUNK)
        outlier = window_is_outlier(means_ptr, window, window < n_windows, median_a, median_b,
                                    n_blocks, BLOCK, BINADES)  # fmt: skip
        n_outlier += tl.sum(outlier.to(tl.int32), axis=0)
    outliers_before, others_before = 0, 0
    for w0 in range(0, n_windows, CHUNK):
        window = w0 + tl.arange(0, CHUNK)
        window_ok = window < n_windows
        outlier = window_is_outlier(means_ptr, window, window_ok, median_a, median_b, n_blocks,
                                    BLOCK, BINADES).to(tl.int32)  # fmt: skip
        other = window_ok.to(tl.int32) - outlier
        slot_outlier = outliers_before + tl.cumsum(outlier, axis=0) - outlier
        slot_other = n_outlier + others_before + tl.cumsum(other, axis=0) - other
        slot = tl.where(outlier != 0, slot_outlier, slot_other)
        tl.store(source_ptr + slot, window, mask=window_ok)
        outliers_before += tl.sum(outlier, axis=0)
        others_before += tl.sum(other, axis=0)
    tl.store(lo_start_ptr, (n_outlier + STEP - 1) // STEP * STEP)
