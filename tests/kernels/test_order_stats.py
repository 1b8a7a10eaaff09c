"""The per-row order statistics of kernels/vector/order_stats.py (the clamp thresholds of the rows
kernel) against torch.sort, compared as order keys (so -0.0 and 0.0 are one value, as they
compare equal, and every NaN one): rows whose ranks sit on the search's bounds, rows that the
candidates decide and rows searched again over every key, all launch layouts the rows kernel
uses (several rows a program, one, rows read in chunks), float32, bfloat16 and float16 values;
and the clamped rows' amax against torch's clamp."""

import pytest
import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.tiles.tile_io import block_at
from fp4cli.kernels.vector.launch import (
    KEY_ZERO_BITS,
    Clamp,
    _row_split,
    bound_split,
    search_splits,
)
from fp4cli.kernels.vector.order_stats import (
    INT32_MAX,
    candidate_groups,
    extreme_pairs,
    order_key,
    read_row_thresholds,
    row_thresholds,
)
from fp4cli.techniques.outliers import nearest_ranks
from tests.kernel_cases import DEVICE, INF, NAN


@triton.jit
def _thresholds_kernel(
    x_ptr, out_ptr, R, C, low_rank, high_rank,
    BR: tl.constexpr, BC: tl.constexpr, ONE_CHUNK: tl.constexpr, TAIL: tl.constexpr,
    GROUP: tl.constexpr, TAIL_GROUP: tl.constexpr, SPLIT_LOW: tl.constexpr,
    SPLIT_HIGH: tl.constexpr, ZERO_BITS: tl.constexpr,
):  # fmt: skip
    """out[row] = (value of rank low_rank, value of rank high_rank, 1.0 when the row's program
    searched over every key, not the candidates, the bits of the clamped row's amax as float32
    bits), as the rows kernel finds them: the row's keys in registers (ONE_CHUNK, as head and
    tail) or read in chunks (every key searched; no amax: 0)."""
    first_row = tl.program_id(0) * BR
    offsets, mask = block_at(first_row, 0, R, C, BR, BC)
    keys = tl.where(mask, order_key(tl.load(x_ptr + offsets, mask=mask).to(tl.float32)), INT32_MAX)
    tail_keys, tail_mask = keys, mask
    if TAIL > 0:
        tail_offsets, tail_mask = block_at(first_row, BC, R, C, BR, TAIL)
        tail_x = tl.load(x_ptr + tail_offsets, mask=tail_mask).to(tl.float32)
        tail_keys = tl.where(tail_mask, order_key(tail_x), INT32_MAX)
    if ONE_CHUNK:
        low, high, amax_bits, searched_all = row_thresholds(
            keys, mask, tail_keys, tail_mask, x_ptr, first_row, R, C, low_rank, high_rank,
            BR, BC, TAIL, GROUP, TAIL_GROUP, SPLIT_LOW, SPLIT_HIGH, ZERO_BITS,
        )  # fmt: skip
    else:
        low, high = read_row_thresholds(
            x_ptr, first_row, R, C, low_rank, high_rank, BR, BC, ZERO_BITS
        )
        searched_all = 1
        amax_bits = tl.zeros([BR], tl.int32)
    rows = first_row + tl.arange(0, BR)
    tl.store(out_ptr + rows * 4, low, mask=rows < R)
    tl.store(out_ptr + rows * 4 + 1, high, mask=rows < R)
    tl.store(out_ptr + rows * 4 + 2, tl.full([BR], searched_all, tl.float32), mask=rows < R)
    tl.store(out_ptr + rows * 4 + 3, amax_bits.to(tl.float32, bitcast=True), mask=rows < R)


def searched(x: torch.Tensor, low: int, high: int, chunk: int, rows_a_program: int):
    """(rows, 4) float32: each row's values of ranks low and high, found by the kernel with
    the row held as the rows kernel holds it (`chunk`: the longest row in registers), whether
    its program searched over every key, and the bits of the clamped row's amax (rows in
    registers)."""
    rows, cols = x.shape
    bc, tail = _row_split(cols, chunk)
    one_chunk = cols <= bc + tail
    group, tail_group = candidate_groups(bc, tail)
    split_low, split_high = search_splits(Clamp(low, high), cols, bc // group, one_chunk)
    out = torch.empty(rows, 4, dtype=torch.float32, device=x.device)
    launch(
        _thresholds_kernel, (-(-rows // rows_a_program),), (x, out, rows, cols, low, high),
        dict(BR=rows_a_program, BC=bc, ONE_CHUNK=one_chunk, TAIL=tail, GROUP=group,
             TAIL_GROUP=tail_group, SPLIT_LOW=split_low, SPLIT_HIGH=split_high,
             ZERO_BITS=KEY_ZERO_BITS.get(x.dtype, 0)),
        1,
    )  # fmt: skip
    return out


def clamped_amax_bits(values: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """The bits of each row's largest |x| once clamped to its values of ranks low and high
    (int32; 0x7FFFFFFF for a row with a NaN)."""
    ordered = values.float().sort(dim=1).values
    clamped = values.float().clamp(ordered[:, low : low + 1], ordered[:, high : high + 1])
    bits = clamped.abs().amax(dim=1).view(torch.int32)
    return torch.where(values.float().isnan().any(dim=1), 0x7FFFFFFF, bits)


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [1, 5, 9, 45, 130, 768])
def test_thresholds_equal_the_sorted_rows(cols, dtype):
    """Every quantile and layout of one dtype (a test per dtype: compiled for a GPU, each case
    is a kernel variant of its own)."""
    values = awkward_rows(cols, seed=cols).to(dtype).to(DEVICE)
    ordered = values.float().cpu().sort(dim=1).values
    launched = set()  # short rows give several quantiles the same ranks: one launch each
    for q in QUANTILES:
        low, high = nearest_ranks(cols, q)
        want = keys(ordered[:, [low, high]].contiguous())
        amax_bits = clamped_amax_bits(values.cpu(), low, high)
        for chunk, rows_a_program in layouts(cols, dtype, q):
            if (low, high, chunk, rows_a_program) in launched:
                continue
            launched.add((low, high, chunk, rows_a_program))
            got = searched(values, low, high, chunk, rows_a_program).cpu()
            case = (q, chunk, rows_a_program)
            assert torch.equal(keys(got[:, :2].contiguous()), want), case
            if cols <= chunk:
                assert torch.equal(got[:, 3].contiguous().view(torch.int32), amax_bits), case


def test_candidates_decide_unless_a_group_holds_three_keys_beyond_a_rank():
    """A row's thresholds come from the candidates (two per side per group of 8 columns)
    when no group holds more than two keys beyond either rank, and from a search over every
    key otherwise, with the same values as torch.sort's: the sorted row's top 8 in one group,
    its bottom 8, three of them, and the top 8 in groups of their own. The searched rows stand
    among rows that the candidates decide, each row a program."""
    cols, (low, high) = 768, nearest_ranks(768, 0.99)
    assert (low, high) == (7, 760)
    x = torch.randn(6, cols, generator=torch.Generator().manual_seed(5))
    x[1, 40:48] = 9.0
    x[2, 100:108] = -9.0 - torch.arange(8.0)
    x[3, 16:19] = 9.0  # three at or above the upper rank's key in group 2
    x[4, ::96] = 9.0 + torch.arange(8.0)  # 8 top values, each its own group
    x[5, 3:5] = 9.0  # two in one group: still candidates
    values = x.to(DEVICE)
    got = searched(values, low, high, 4096, 1).cpu()
    want = keys(values.cpu().sort(dim=1).values[:, [low, high]].contiguous())
    assert torch.equal(keys(got[:, :2].contiguous()), want)
    assert got[:, 2].tolist() == [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]


@triton.jit
def _pairs_kernel(keys_ptr, out_ptr, N: tl.constexpr, GROUP: tl.constexpr, UPPER: tl.constexpr,
                  BY_COMBINE: tl.constexpr):  # fmt: skip
    """out = (first, second) of each group of a (2, N) int32 tile, as `extreme_pairs` gives them."""
    offsets = tl.arange(0, 2)[:, None] * N + tl.arange(0, N)[None, :]
    first, second = extreme_pairs(tl.load(keys_ptr + offsets), 2, N, GROUP, UPPER, BY_COMBINE)
    groups = tl.arange(0, 2)[:, None] * (N // GROUP) + tl.arange(0, N // GROUP)[None, :]
    tl.store(out_ptr + groups * 2, first)
    tl.store(out_ptr + groups * 2 + 1, second)


@pytest.mark.parametrize("by_combine", [True, False])
def test_extreme_pairs_are_each_groups_two_extremes(by_combine):
    """Both ways of reducing the pairs (one combine on a GPU, standard reductions under the
    interpreter) give torch.topk's two largest or smallest keys of every group of 8, ties, a
    key held twice, the int32 extremes and a group of one key included."""
    generator = torch.Generator().manual_seed(3)
    keys = torch.randint(-5, 5, (2, 64), generator=generator, dtype=torch.int32)
    keys[0, :8] = 2**31 - 1
    keys[1, 8:16] = -(2**31)
    keys[1, 16:24] = torch.tensor([7, 7, 1, 1, 1, 1, 1, 1], dtype=torch.int32)
    for upper in (True, False):
        for group in (8, 1):
            want = keys.view(2, -1, group).topk(min(2, group), dim=2, largest=upper).values
            if group == 1:  # a group of one key: its second is the unset extreme
                unset = -(2**31) if upper else 2**31 - 1
                want = torch.cat([want, torch.full_like(want, unset)], dim=2)
            out = torch.empty(2, 64 // group, 2, dtype=torch.int32, device=DEVICE)
            launch(_pairs_kernel, (1,), (keys.to(DEVICE), out),
                   dict(N=64, GROUP=group, UPPER=upper, BY_COMBINE=by_combine), 1)  # fmt: skip
            assert torch.equal(out.cpu(), want), (upper, group)


def test_bound_split_covers_the_keys_beyond_the_rank():
    """A split of s groups bounds a rank with at most s keys beyond it; none when the head
    holds fewer values than that."""
    assert bound_split(8, 512) == 8
    assert bound_split(31, 2048) == 32
    assert bound_split(1, 4) == 1
    assert bound_split(5, 4) == 0
    assert bound_split(512, 512) == 512
