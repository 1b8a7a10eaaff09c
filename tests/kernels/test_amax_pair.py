"""The tensor amax pass of two-level pairs (`pair_amax`) against the reference quantizer's
tensor amax, bit for bit: the 16-slab kernel of a 16-point transform down the columns, the
slab kernels of 16- or 32-point transforms both ways, and the tile kernel of every other pair
(interpreter on the CPU, or a GPU)."""

import pytest
import torch

from fp4cli.quant import QuantSpec, quantize
from fp4cli.techniques.hadamard import rht_matrix
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    DEVICE,
    FP32_MAX,
    INF,
    MXFP4,
    NAN,
    NVFP4,
    NVFP4_SR,
    assert_bits,
    on_device,
    seeded_normal,
)
from tests.kernel_checks import assert_encode_table

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
launch_amax = pytest.importorskip("fp4cli.kernels.quantization.launch_amax")
Direction, pair_amax, pair_tile = (
    launch_pair.Direction,
    launch_amax.pair_amax,
    launch_pair.pair_tile,
)


def _input(rows, cols, seed=0):
    x = seeded_normal((rows, cols), seed) * torch.exp2(seeded_normal((1, cols), seed + 1) * 6)
    return on_device(x)


def _seed(seed):
    """The reference's seed for a kernel seed (a (tensor, offset) pair is their sum)."""
    return seed[0] + seed[1] if isinstance(seed, tuple) else seed


def _reference_amax(x, d, axis):
    args = dict(hadamard=d.hadamard, hadamard_seed=_seed(d.hadamard_seed), backend="torch")
    return quantize(x, d.spec, axis, _seed(d.seed), **args).tensor_amax


def _check(x, row, col):
    """`pair_amax` (the partial maxima reduced by torch) and `pair_amax_pass` (the amaxes and
    encode tables written by the pass's last program) against the reference."""
    amax = pair_amax(x, row, col, pair_tile(row, col))
    row_amax, col_amax, row_table, col_table = launch_pair.pair_amax_pass(
        x, row, col, pair_tile(row, col)
    )
    for d, axis, passed, table in ((row, 1, row_amax, row_table), (col, 0, col_amax, col_table)):
        if d is None or not d.spec.tensor_scale:
            assert amax[1 - axis].item() == 0.0
            assert passed is None and table is None
        else:
            expected = _reference_amax(x, d, axis)
            assert_bits(amax[1 - axis], expected, f"amax along axis {axis}")
            assert_bits(passed.reshape(()), expected.reshape(()), f"the pass's amax, axis {axis}")
            assert_encode_table(table, expected.reshape(()).cpu(), d.spec)


@pytest.fixture
def slab_kernel_only(monkeypatch):
    """Fails a test whose pairs reach the tile kernel."""

    class Refused:
        fn = staticmethod(launch_amax.amax_pair_kernel.fn)  # its parameters, for `launch`

        def __getitem__(self, grid):
            raise AssertionError("the tile kernel ran where a slab kernel should")

    monkeypatch.setattr(launch_amax, "amax_pair_kernel", Refused())


ROWS = {  # the row direction beside a 16-point transform down the columns
    "two-level": Direction(NVFP4, None),
    "one-level": Direction(MXFP4, None),
    "none": None,
}


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("shape", [(64, 128), (70, 100), (7, 33), (200, 300)])
def test_the_16_slab_kernel_gives_the_reference_amax(slab_kernel_only, row, shape):
    x = _input(*shape, seed=shape[0])
    _check(x, ROWS[row], Direction(NVFP4_SR, 3, 16, 41))


@pytest.mark.parametrize("shape", [(96, 160), (192, 256)])
def test_the_16_slab_kernel_on_zeros_non_finite_and_overflowing_sums(slab_kernel_only, shape):
    """(192, 256): whole 64 x 128 tiles, read without masks, several a program."""
    col = Direction(NVFP4, None, 16, 5)
    x = _input(*shape, seed=3)
    x[0:16, 7] = FP32_MAX  # sums of 16 overflow: Inf, which the amax leaves out
    x[40, 9], x[41, 150], x[95, 0] = NAN, INF, -INF
    x[50, 20] = -3e38
    _check(x, ROWS["two-level"], col)
    _check(on_device(torch.zeros(33, 17)), ROWS["two-level"], col)
    _check(on_device(torch.full((16, 16), NAN)), ROWS["two-level"], col)
    tiny = _input(48, 48, seed=4) * 1e-42  # subnormal values and sums
    _check(tiny, ROWS["two-level"], col)


def test_the_16_slab_kernel_on_bfloat16_and_tensor_seeds(slab_kernel_only):
    x = _input(80, 96, seed=6).to(torch.bfloat16)
    base = torch.tensor(2**62 + 9, dtype=torch.int64, device=DEVICE)
    _check(x, ROWS["two-level"], Direction(NVFP4_SR, (base, 1), 16, (base, 2)))
    _check(x, None, Direction(NVFP4, None, 16, base))


def _padded(x, shape):
    """x in the top left corner of zeros of `shape` (whole tiles: loads without masks)."""
    out = torch.zeros(shape)
    out[: x.shape[0], : x.shape[1]] = x
    return out


@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize("position", range(16))
def test_each_transformed_position_can_hold_the_amax(slab_kernel_only, position, even):
    """x = R y for y peaked at one position of its 16-block: after the transform the amax is
    at that position, so every butterfly output is checked (even: in whole tiles)."""
    y = seeded_normal((16, 24), position) * 0.1
    y[position] = 100.0 + seeded_normal((24,), position + 16)
    x = (rht_matrix(16, 29).to(torch.float64) @ y.to(torch.float64)).to(torch.float32)
    x = _padded(x, (64, 128)) if even else x
    _check(on_device(x), None, Direction(NVFP4, None, 16, 29))


UE5M3_SR = QuantSpec.preset("mxfp4-ue5m3", rounding="sr", scale_rule="ceil")
BOTH = {  # transforms of one size both ways: ue5m3-hadamard-sr's pairs, ufp4's
    32: (Direction(UE5M3_SR, 3, 32, 5), Direction(UE5M3_SR, 4, 32, 6)),
    16: (Direction(NVFP4, None, 16, 5), Direction(NVFP4_SR, 4, 16, 6)),
}


@pytest.mark.parametrize("size", [32, 16])
@pytest.mark.parametrize("shape", [(64, 256), (7, 33), (100, 530)])
def test_the_both_ways_slab_kernels_give_the_reference_amax(slab_kernel_only, shape, size):
    """(100, 530): ragged row and column tiles, and programs that read several tiles."""
    _check(_input(*shape, seed=shape[1]), *BOTH[size])


@pytest.mark.parametrize("size", [32, 16])
@pytest.mark.parametrize("shape", [(96, 160), (160, 512)])
def test_the_both_ways_slab_kernels_on_zeros_non_finite_and_overflowing_sums(
    slab_kernel_only, shape, size
):
    """(160, 512): whole 32 x 256 tiles, read without masks, several a program."""
    x = _input(*shape, seed=3)
    x[0:size, 7] = FP32_MAX  # sums of a block overflow down a column
    x[40, 9], x[41, 150], x[95, 0] = NAN, INF, -INF
    _check(x, *BOTH[size])
    for line in (0, 1):  # the last stage's pair: one output overflows, the other is the amax
        x = _input(64, 64, seed=line)
        x[(34, 34), (0, size // 2)] = torch.tensor([3e38, -1e38], device=x.device)
        _check(x if line == 0 else x.T.contiguous(), *BOTH[size])
    _check(on_device(torch.zeros(33, 17)), *BOTH[size])
    _check(on_device(torch.full((32, 32), NAN)), *BOTH[size])
    _check(_input(64, 96, seed=4) * 1e-42, *BOTH[size])  # subnormal values and sums


@pytest.mark.parametrize("size", [32, 16])
def test_the_both_ways_slab_kernels_on_bfloat16_and_tensor_seeds(slab_kernel_only, size):
    x = _input(80, 96, seed=6).to(torch.bfloat16)
    base = torch.tensor(-(2**62) - 5, dtype=torch.int64, device=DEVICE)
    spec = BOTH[size][0].spec
    _check(x, Direction(spec, 1, size, (base, 2)), Direction(spec, 2, size, base))


@pytest.mark.parametrize("size", [32, 16])
@pytest.mark.parametrize("even", [False, True])
def test_each_transformed_position_of_both_ways_can_hold_the_amax(slab_kernel_only, even, size):
    """x = R y for y peaked at one position of its block, down the columns (then x^T along
    the rows): every output of both butterflies is checked (even: in whole 32 x 256 tiles)."""
    for position in range(size):
        y = seeded_normal((size, 8), position) * 0.1
        y[position] = 100.0 + seeded_normal((8,), position + 32)
        x = (rht_matrix(size, 6).to(torch.float64) @ y.to(torch.float64)).to(torch.float32)
        _check(on_device(_padded(x, (32, 256)) if even else x), *BOTH[size])
        x = (rht_matrix(size, 5).to(torch.float64) @ y.to(torch.float64)).to(torch.float32).T
        _check(on_device(_padded(x, (32, 256)) if even else x.contiguous()), *BOTH[size])


@pytest.mark.parametrize("row_h,col_h", [(None, None), (16, None), (32, 16), (None, 32), (16, 16)])
@pytest.mark.parametrize("cols", [100, 600])
def test_the_tile_kernel_gives_the_reference_amax(row_h, col_h, cols):
    """Transforms both ways take the tile kernel in 32 x 256 tiles (600 columns: a ragged
    third), but for one size both ways, 16 or 32 (the slab kernels); the amax is the
    reference's either way."""
    x = _input(70, cols, seed=8)
    x[3, 4] = NAN
    _check(x, Direction(NVFP4, None, row_h, 7), Direction(NVFP4_SR, 2, col_h, 9))


@pytest.mark.parametrize("hadamard", [128, 256])
@pytest.mark.parametrize("shape", [(300, 130), (130, 300), (16, 520)])
def test_a_lone_wide_transform_takes_its_own_tile(hadamard, shape):
    """A lone direction transformed over 128 positions or more (Quartet II's RHT-128) reads
    8 x 256 tiles along the rows and 128 x 32 down the columns (`_amax_tile`); ragged both
    ways, a NaN and an Inf left out, the reference's amax."""
    row, col = Direction(NVFP4, None, hadamard, 7), Direction(NVFP4_SR, 2, hadamard, 9)
    assert launch_amax._amax_tile((16, hadamard), row, None, False) == (8, 256, 2)
    assert launch_amax._amax_tile((hadamard, 16), None, col, False) == (hadamard, 32, 4)
    x = _input(*shape, seed=shape[0])
    x[3, 4], x[-1, -1] = NAN, -INF
    _check(x, row, None)
    _check(x, None, col)
