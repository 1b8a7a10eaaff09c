"""Where the exact MXFP4 GEMM splits K: the few 32-wide windows whose blocks sit far above the
rest of their rows (activation outlier channels) go to the FP8 tier, the rest to INT8.

An outlier channel lifts its blocks' scales about 2^8 above the rest of every row, so whole rows
span more than INT8's 4 binades and every tile would take the FP8 tier. The split moves those
windows out of INT8's segment instead. The rule (`outlier_columns`, the definition the kernels
follow): a block column of an operand (a block position along K) is an outlier column when its
rows' mean scale code, rounded down, exceeds the median column's by more than OUTLIER_BINADES.
Both operands' outlier columns form one set (the two must pair the same K positions); its
windows come first in the staged order, the rest after, each in K order.

The kernels make the choice on the device, with no host synchronisation: it only decides where
the work goes. Whatever it picks, the product is exact (`gemm.prep` flags every row its tiers
cannot hold, and those tiles take the FP8 kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

OUTLIER_BINADES = 2
HI_STEP = 2  # the FP8 segment is read 64 wide: its length is rounded up to 2 windows
SUM_ROWS, SUM_STEPS, SUM_COLUMNS = 64, 4, 64  # a column-sum program: rows per step, steps, columns
ORDER_CHUNK = 256  # columns or windows per step of the ordering program


@dataclass(frozen=True)
class KSplit:
    """source (K / 32,) int32: the K window each staged slot holds (FP8 segment first);
    lo_start (1,) int32: the first slot of the INT8 segment (even)."""

    source: torch.Tensor
    lo_start: torch.Tensor


def outlier_columns(scales: torch.Tensor) -> torch.Tensor:
    """(blocks,) bool: the rule, on one operand's (rows, blocks) scale codes."""
    means = scales.sum(0, dtype=torch.int32) // scales.shape[0]
    return means > means.median() + OUTLIER_BINADES


@torch.compiler.disable
def k_split(scales_a: torch.Tensor, scales_b: torch.Tensor, block: int) -> KSplit:
    """The split of K for operands with these (rows, K / block) scale codes: a zeroing and two
    launches."""
    (rows_a, n_blocks), rows_b = scales_a.shape, scales_b.shape[0]
    device = scales_a.device
    sums = torch.zeros(2, n_blocks, dtype=torch.int32, device=device)
    rows_per_program = SUM_ROWS * SUM_STEPS
    programs_a = triton.cdiv(rows_a, rows_per_program)
    programs = programs_a + triton.cdiv(rows_b, rows_per_program)
    column_sums_kernel[(programs, triton.cdiv(n_blocks, SUM_COLUMNS))](
        scales_a, scales_b, sums, rows_a, rows_b, n_blocks,
        ROWS=SUM_ROWS, STEPS=SUM_STEPS, COLUMNS=SUM_COLUMNS,
    )  # fmt: skip
    n_windows = n_blocks * block // 32
    source = torch.empty(n_windows, dtype=torch.int32, device=device)
    lo_start = torch.empty(1, dtype=torch.int32, device=device)
    split_order_kernel[(1,)](
        sums, source, lo_start, rows_a, rows_b, n_blocks, n_windows, BLOCK=block,
        CHUNK=ORDER_CHUNK, BINADES=OUTLIER_BINADES, STEP=HI_STEP,
    )  # fmt: skip
    return KSplit(source, lo_start)


@triton.jit
def add_column_sums(scales_ptr, sums_ptr, program, rows, n_blocks, ROWS: tl.constexpr,
                    STEPS: tl.constexpr, COLUMNS: tl.constexpr):  # fmt: skip
    """Add one program's ROWS * STEPS rows of COLUMNS columns of (rows, n_blocks) uint8 codes
    to the columns' int32 sums (atomically: integer sums, the same in any order)."""
    column = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    column_ok = column < n_blocks
    total = tl.zeros([COLUMNS], tl.int32)
    for step in range(STEPS):
        row = (program * STEPS + step) * ROWS + tl.arange(0, ROWS)
        mask = (row < rows)[:, None] & column_ok[None, :]
        offsets = row.to(tl.int64)[:, None] * n_blocks + column[None, :]
        codes = tl.load(scales_ptr + offsets, mask=mask, other=0)
        total += tl.sum(codes.to(tl.int32), axis=0)
    tl.atomic_add(sums_ptr + column, total, mask=column_ok)


@triton.jit
def column_sums_kernel(a_scales_ptr, b_scales_ptr, sums_ptr, rows_a, rows_b, n_blocks,
                       ROWS: tl.constexpr, STEPS: tl.constexpr, COLUMNS: tl.constexpr):  # fmt: skip
    """sums (2, n_blocks) int32, zeroed: A's column sums, then B's. Axis 0: A's row chunks,
    then B's; axis 1: column chunks."""
    pid = tl.program_id(0)
    programs_a = tl.cdiv(rows_a, ROWS * STEPS)
    if pid < programs_a:
        add_column_sums(a_scales_ptr, sums_ptr, pid, rows_a, n_blocks, ROWS, STEPS, COLUMNS)
    else:
        add_column_sums(b_scales_ptr, sums_ptr + n_blocks, pid - programs_a, rows_b, n_blocks,
                        ROWS, STEPS, COLUMNS)  # fmt: skip


@triton.jit
def lower_median(sums_ptr, rows, n_blocks, CHUNK: tl.constexpr):
    """The lower median of the n_blocks column means (sums // rows, in [0, 255]): the least v
    with at least (n_blocks + 1) // 2 means <= v, counted for every v at once."""
    value = tl.arange(0, 256)
    at_most = tl.zeros([256], tl.int32)
    for c0 in range(0, n_blocks, CHUNK):
        column = c0 + tl.arange(0, CHUNK)
        means = tl.load(sums_ptr + column, mask=column < n_blocks, other=256 * rows) // rows
        at_most += tl.sum((means[None, :] <= value[:, None]).to(tl.int32), axis=1)
    return tl.min(tl.where(at_most >= (n_blocks + 1) // 2, value, 256), axis=0)


@triton.jit
def window_is_outlier(sums_ptr, window, window_ok, rows_a, rows_b, median_a, median_b,
                      n_blocks, BLOCK: tl.constexpr, BINADES: tl.constexpr):  # fmt: skip
    block = window * 32 // BLOCK
    mean_a = tl.load(sums_ptr + block, mask=window_ok, other=0) // rows_a
    mean_b = tl.load(sums_ptr + n_blocks + block, mask=window_ok, other=0) // rows_b
    return ((mean_a > median_a + BINADES) | (mean_b > median_b + BINADES)) & window_ok


@triton.jit
def split_order_kernel(sums_ptr, source_ptr, lo_start_ptr, rows_a, rows_b, n_blocks, n_windows,
                       BLOCK: tl.constexpr, CHUNK: tl.constexpr, BINADES: tl.constexpr,
                       STEP: tl.constexpr):  # fmt: skip
    """One program, on the column sums: each operand's median column mean, then the windows'
    staged order (outlier windows first) and the INT8 segment's first slot, rounded up to
    STEP."""
    median_a = lower_median(sums_ptr, rows_a, n_blocks, CHUNK)
    median_b = lower_median(sums_ptr + n_blocks, rows_b, n_blocks, CHUNK)
    n_outlier = 0
    for w0 in range(0, n_windows, CHUNK):
        window = w0 + tl.arange(0, CHUNK)
        outlier = window_is_outlier(sums_ptr, window, window < n_windows, rows_a, rows_b,
                                    median_a, median_b, n_blocks, BLOCK, BINADES)  # fmt: skip
        n_outlier += tl.sum(outlier.to(tl.int32), axis=0)
    outliers_before, others_before = 0, 0
    for w0 in range(0, n_windows, CHUNK):
        window = w0 + tl.arange(0, CHUNK)
        window_ok = window < n_windows
        outlier = window_is_outlier(sums_ptr, window, window_ok, rows_a, rows_b, median_a,
                                    median_b, n_blocks, BLOCK, BINADES).to(tl.int32)  # fmt: skip
        other = window_ok.to(tl.int32) - outlier
        slot_outlier = outliers_before + tl.cumsum(outlier, axis=0) - outlier
        slot_other = n_outlier + others_before + tl.cumsum(other, axis=0) - other
        slot = tl.where(outlier != 0, slot_outlier, slot_other)
        tl.store(source_ptr + slot, window, mask=window_ok)
        outliers_before += tl.sum(outlier, axis=0)
        others_before += tl.sum(other, axis=0)
    tl.store(lo_start_ptr, (n_outlier + STEP - 1) // STEP * STEP)
