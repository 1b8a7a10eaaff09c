"""The per-row order statistics of kernels/order_stats.py (the clamp thresholds of the rows
kernel) against torch.sort, compared as order keys (so -0.0 and 0.0 are one value, as they
compare equal, and every NaN one): rows whose ranks sit on the search's bounds, all launch
layouts the rows kernel uses (several rows a program, one, rows read in chunks), float32,
bfloat16 and float16 values."""

import pytest
import torch
import triton
import triton.language as tl

from fp4cli.kernels.launch import launch
from fp4cli.kernels.launch_vector import (
    KEY_ZERO_BITS,
    Clamp,
    _row_split,
    bound_split,
    search_splits,
)
from fp4cli.kernels.order_stats import (
    INT32_MAX,
    order_key,
    read_row_thresholds,
    row_thresholds,
)
from fp4cli.kernels.tile_io import block_at
from fp4cli.techniques.outliers import nearest_ranks
from tests.kernel_cases import DEVICE, INF, NAN


@triton.jit
def _thresholds_kernel(
    x_ptr, out_ptr, R, C, low_rank, high_rank,
    BR: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr, TAIL: tl.constexpr,
    SPLIT_LOW: tl.constexpr, SPLIT_HIGH: tl.constexpr, ZERO_BITS: tl.constexpr,
):  # fmt: skip
    """out[row] = (value of rank low_rank, value of rank high_rank), as the rows kernel finds
    them: the row's keys in registers (ONE_CHUNK, as head and tail) or read in chunks."""
    first_row = tl.program_id(0) * BR
    offsets, mask = block_at(first_row, 0, R, C, BR, BC)
    keys = tl.where(mask, order_key(tl.load(x_ptr + offsets, mask=mask).to(tl.float32)), INT32_MAX)
    tail_keys, tail_mask = keys, mask
    if TAIL > 0:
        tail_offsets, tail_mask = block_at(first_row, BC, R, C, BR, TAIL)
        tail_x = tl.load(x_ptr + tail_offsets, mask=tail_mask).to(tl.float32)
        tail_keys = tl.where(tail_mask, order_key(tail_x), INT32_MAX)
    if ONE_CHUNK:
        low, high = row_thresholds(
            keys, mask, tail_keys, tail_mask, x_ptr, first_row, R, C, low_rank, high_rank,
            BR, BC, TAIL, SPLIT_LOW, SPLIT_HIGH, ZERO_BITS,
        )  # fmt: skip
    else:
        low, high = read_row_thresholds(
            x_ptr, first_row, R, C, low_rank, high_rank, BR, BC, ZERO_BITS
        )
    rows = first_row + tl.arange(0, BR)
    tl.store(out_ptr + rows * 2, low, mask=rows < R)
    tl.store(out_ptr + rows * 2 + 1, high, mask=rows < R)


def thresholds(x: torch.Tensor, low: int, high: int, chunk: int, rows_a_program: int):
    """(rows, 2) float32: each row's values of ranks low and high, found by the kernel with
    the row held as the rows kernel holds it (`chunk`: the longest row in registers)."""
    rows, cols = x.shape
    bc, tail = _row_split(cols, chunk)
    one_chunk = cols <= bc + tail
    split_low, split_high = search_splits(Clamp(low, high), cols, bc, one_chunk)
    out = torch.empty(rows, 2, dtype=torch.float32, device=x.device)
    launch(
        _thresholds_kernel, (-(-rows // rows_a_program),), (x, out, rows, cols, low, high),
        dict(BR=rows_a_program, BC=bc, ONE_CHUNK=one_chunk, TAIL=tail,
             SPLIT_LOW=split_low, SPLIT_HIGH=split_high,
             ZERO_BITS=KEY_ZERO_BITS.get(x.dtype, 0)),
        1,
    )  # fmt: skip
    return out


def keys(values: torch.Tensor) -> torch.Tensor:
    """The order keys of float32 values (int64: +|x| bits, -|x| bits below zero, NaN last)."""
    magnitude = (values.view(torch.int32) & 0x7FFFFFFF).to(torch.int64)
    key = torch.where(values.view(torch.int32) < 0, -magnitude, magnitude)
    return torch.where(values.isnan(), 2**31, key)


def awkward_rows(cols: int, seed: int) -> torch.Tensor:
    """Rows that put the ranks on the bounds: one sign only, ties across the groups, the top
    values in one group, two values, spread outliers, NaN and Inf, a constant row."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(10, cols, generator=generator)
    x[1] = x[1].abs() + 1
    x[2] = -x[2].abs() - 1
    x[3, : cols // 2] = 7.0
    x[4, : min(8, cols)] = 1e6
    x[5] = torch.arange(cols) % 2 - 0.5
    x[6, ::3] *= 50
    x[7, -1] = NAN
    x[7, 0] = -INF
    x[8] = 0.0
    x[8, ::2] = -0.0
    x[9, : cols // 3] = INF
    return x


QUANTILES = (0.999, 0.99, 0.9, 0.6)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def layouts(cols: int, dtype: torch.dtype, q: float) -> list[tuple[int, int]]:
    """(chunk, rows a program) to hold the rows in: several rows a program for every case, one
    row a program for one dtype a quantile, rows read in up to 3 chunks for two cases (the
    interpreter's slowest: every bit searched)."""
    chunk_read = max(4, 1 << (cols // 3 - 1).bit_length())
    held = [(4096, 4)]
    if dtype == DTYPES[QUANTILES.index(q) % len(DTYPES)]:
        held.append((4096, 1))
    if (dtype, q) in ((torch.float32, 0.99), (torch.bfloat16, 0.6)):
        held.append((chunk_read, 1))
    return held


@pytest.mark.parametrize("cols", [1, 5, 9, 45, 130, 768])
def test_thresholds_equal_the_sorted_rows(cols):
    x = awkward_rows(cols, seed=cols)
    for dtype in DTYPES:
        values = x.to(dtype).to(DEVICE)
        ordered = values.float().cpu().sort(dim=1).values
        for q in QUANTILES:
            low, high = nearest_ranks(cols, q)
            want = keys(ordered[:, [low, high]].contiguous())
            for chunk, rows_a_program in layouts(cols, dtype, q):
                got = thresholds(values, low, high, chunk, rows_a_program).cpu()
                assert torch.equal(keys(got), want), (dtype, q, chunk, rows_a_program)


def test_bound_split_covers_the_keys_beyond_the_rank():
    """A split of s groups bounds a rank with at most s keys beyond it; none when the head
    holds fewer values than that."""
    assert bound_split(8, 512) == 8
    assert bound_split(31, 2048) == 32
    assert bound_split(1, 4) == 1
    assert bound_split(5, 4) == 0
    assert bound_split(512, 512) == 512
