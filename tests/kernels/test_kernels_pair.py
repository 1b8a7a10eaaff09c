"""quantize_pair (both block directions of a 2-D tensor in one launch) against the reference
quantizer along each axis, bit for bit (interpreter on the CPU, or a GPU)."""

import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize, quantize
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    DEVICE,
    INF,
    MXFP4,
    MXFP4_AWAY,
    MXFP4_SR,
    MXFP4_SR_PRESCALE,
    NAN,
    NVFP4,
    NVFP4_AWAY,
    NVFP4_SR,
    assert_bits,
    on_device,
    rows_over_binades,
)

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
Direction, pair_tile, quantize_pair = (
    launch_pair.Direction,
    launch_pair.pair_tile,
    launch_pair.quantize_pair,
)

CEIL = QuantSpec.preset("mxfp4-ceil")
CEIL_SR = CEIL.replace(rounding="sr")
PAIR_SPECS = {
    "mxfp4": MXFP4,
    "ceil": CEIL,
    "sr": MXFP4_SR,
    "ceil-sr": CEIL_SR,
    "sr-prescale": MXFP4_SR_PRESCALE,
    "ue5m3-ceil": QuantSpec(scale="ue5m3", scale_rule="ceil"),
    "ue4m3-sr-block16": QuantSpec(scale="ue4m3", block=16, rounding="sr"),
    "block64": MXFP4.replace(block=64),
    "block8": MXFP4.replace(block=8),
    "nvfp4": NVFP4,
    "nvfp4-sr": NVFP4_SR,
    "ue5m3-two-level-ceil-sr": QuantSpec.preset("mxfp4-ue5m3", scale_rule="ceil", rounding="sr"),
    "away": MXFP4_AWAY,
    "nvfp4-away": NVFP4_AWAY,
}
NVFP4_2D = QuantSpec.preset("nvfp4-2d")
UE5M3_SR = QuantSpec.preset("mxfp4-ue5m3", rounding="sr", scale_rule="ceil")
EDEN = QuantSpec.preset("nvfp4-eden")


def _reference(x, d, axis):
    """The reference's quantization of x along `axis` as direction d asks (values or codes)."""
    args = dict(hadamard=d.hadamard, hadamard_seed=d.hadamard_seed, backend="torch")
    if d.block_values:
        return quantize(x, d.spec, axis, d.seed, **args).block_values(d.values_dtype, "torch")
    if d.values_dtype is not None:
        return fake_quantize(x, d.spec, axis, d.seed, out_dtype=d.values_dtype, **args)
    return quantize(x, d.spec, axis, d.seed, **args)


def _assert_direction(out, reference, what):
    if isinstance(reference, torch.Tensor):
        # The reference's fake_quantize keeps the sign of a value rounded to zero; codes do not.
        zero = reference == 0
        assert_bits(torch.where(zero, 0.0, out.values), torch.where(zero, 0.0, reference), what)
        assert out.codes is None
    else:
        assert_bits(out.codes, reference.codes, f"{what} codes")
        assert_bits(out.scales, reference.scales, f"{what} scale codes")
        if reference.tensor_amax is None:
            assert out.tensor_amax is None
        else:
            assert_bits(out.tensor_amax.reshape(()), reference.tensor_amax, f"{what} amax")


def _check(x, row, col, double=None):
    row_out, col_out = quantize_pair(x, row, col, double)
    if row is not None:
        _assert_direction(row_out, _reference(x, row, 1), "row direction")
    else:
        assert row_out is None
    if col is None:
        assert col_out is None
        return
    source = x
    if double is not None:
        as_values = row.__class__(row.spec, row.seed, row.hadamard, row.hadamard_seed, double)
        source = _reference(x, as_values, 1)
    _assert_direction(col_out, _reference(source, col, 0), "column direction")


@pytest.mark.parametrize("name", PAIR_SPECS)
@pytest.mark.parametrize("shape", [(64, 64), (70, 100), (33, 7)])
def test_both_directions_match_the_reference(name, shape):
    spec = PAIR_SPECS[name]
    x = rows_over_binades(*shape)
    _check(x, Direction(spec, 11, values_dtype=torch.float32), Direction(spec, 12))
    _check(x, Direction(spec, 13), Direction(spec, 14, values_dtype=torch.float32))


@pytest.mark.parametrize(
    "row_h,col_h", [(None, 64), (32, None), (64, 32), (16, 128), (128, 64), (256, 32)]
)
def test_hadamard_on_either_side(row_h, col_h):
    x = rows_over_binades(70, 100, seed=3)
    row = Direction(CEIL, None, row_h, 21, values_dtype=torch.float32)
    col = Direction(MXFP4_SR_PRESCALE, 22, col_h, 23)
    _check(x, row, col)


@pytest.mark.parametrize("col_h", [None, 64])
@pytest.mark.parametrize("col_spec", ["ceil-sr", "sr-prescale"])
def test_double_quantization_requantizes_the_row_values(col_spec, col_h):
    x = rows_over_binades(96, 80, seed=4)
    row = Direction(CEIL, None, values_dtype=torch.float32)
    col = Direction(PAIR_SPECS[col_spec], 5, col_h, 6)
    _check(x, row, col, double=torch.float32)
    # packed forward codes: the double quantization still reads the row values
    _check(x, Direction(CEIL, None), col, double=torch.float32)


def test_one_direction_alone():
    x = rows_over_binades(45, 66, seed=5)
    _check(x, Direction(CEIL_SR, 9, 32, 10), None)
    _check(x, None, Direction(CEIL_SR, 9, 32, 10, values_dtype=torch.float32))


def test_non_finite_values_poison_their_blocks_in_both_directions():
    x = rows_over_binades(64, 96, seed=6)
    x[3, 5], x[40, 70], x[63, 0] = NAN, INF, -INF
    row = Direction(MXFP4, None, values_dtype=torch.float32)
    _check(x, row, Direction(CEIL_SR, 8))
    _check(x, row, Direction(CEIL_SR, 8), double=torch.float32)
    _check(x, Direction(MXFP4, None), Direction(CEIL, None, values_dtype=torch.float32))


def test_zeros_ties_and_tiny_and_huge_scales():
    x = rows_over_binades(64, 64, seed=7)
    x[:32, :32] = 0.0  # an all-zero block in both directions
    x[32, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4)  # E2M1 ties
    x[33, :] = 1e-40  # subnormal float32
    x[34, :] = 3e38
    _check(x, Direction(MXFP4, None, values_dtype=torch.float32), Direction(CEIL, None))
    _check(x, Direction(CEIL, None), Direction(MXFP4_SR, 3, values_dtype=torch.float32))


@pytest.mark.parametrize("spec", [MXFP4_AWAY, NVFP4_AWAY], ids=["mxfp4", "nvfp4"])
def test_ties_away_from_zero_both_ways(spec):
    """Each E2M1 tie t times s after the anchor 6 s (s = +-2^-3, +-1, +-2^4: exact under the
    tensor scale too), along rows 0-5 and down columns 32-37: t rounded away from zero, times
    s, in both directions; then zeros, subnormal inputs, a huge block and NaN / Inf against the
    reference."""
    anchor_and_ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]).repeat(4)
    rounded = torch.tensor([6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]).repeat(4)
    x = torch.zeros(64, 64)
    scales = [2.0**-3, -(2.0**-3), 1.0, -1.0, 2.0**4, -(2.0**4)]
    for i, scale in enumerate(scales):
        x[i, :32] = anchor_and_ties * scale
        x[32:, 32 + i] = anchor_and_ties * scale
    away = Direction(spec, None, values_dtype=torch.float32)
    row_out, col_out = quantize_pair(on_device(x), away, away)
    for i, scale in enumerate(scales):
        expected = on_device(rounded * scale)
        assert_bits(row_out.values[i, :32], expected, f"row {i}")
        assert_bits(col_out.values[32:, 32 + i], expected, f"column {32 + i}")
    _check(on_device(x), away, Direction(spec, None))
    x = rows_over_binades(64, 64, seed=13)
    x[40:56, 48:] = 0.0
    x[60, :] = 1e-40
    x[61, :16] = 3e38
    x[62, 3], x[20, 62] = NAN, -INF
    _check(x, away, Direction(spec, None))
    _check(x, Direction(spec, None), away)


def test_tensor_seeds_and_seed_offsets_draw_the_reference_bits():
    x = rows_over_binades(64, 64, seed=8)
    base = torch.tensor(2**62 + 5, dtype=torch.int64, device=DEVICE)
    row_out, col_out = quantize_pair(
        x,
        Direction(MXFP4_SR, (base, 7), 32, (base, 9)),
        Direction(MXFP4_SR, (base, -3), 64, (base, 11)),
    )
    row_ref = quantize(x, MXFP4_SR, 1, base + 7, hadamard=32, hadamard_seed=base + 9)
    col_ref = quantize(x, MXFP4_SR, 0, base - 3, hadamard=64, hadamard_seed=base + 11)
    assert_bits(row_out.codes, row_ref.codes, "row codes")
    assert_bits(col_out.codes, col_ref.codes, "column codes")


@pytest.mark.parametrize("row_h,col_h", [(None, 16), (16, None), (32, 16)])
def test_two_level_amax_of_each_transformed_direction(row_h, col_h):
    """Each direction's tensor amax is of what it quantizes: x, or x transformed along it."""
    x = rows_over_binades(70, 100, seed=10)
    _check(x, Direction(NVFP4, None, row_h, 31, torch.float32), Direction(NVFP4_SR, 32, col_h, 33))


def test_two_level_edge_cases():
    x = rows_over_binades(64, 64, seed=11)
    x[:32, :32] = 0.0
    x[32, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2)
    x[33, :] = 1e-40  # under the tensor's amax by far: block scales round to zero
    x[34, 0] = 3e38
    values = Direction(NVFP4, None, values_dtype=torch.float32)
    _check(x, values, Direction(NVFP4_SR, 4))
    x[5, 7], x[50, 60] = NAN, -INF  # poisons two blocks each way; the amax is of the rest
    _check(x, Direction(NVFP4, None), Direction(NVFP4_SR, 4, values_dtype=torch.float32))
    zeros = on_device(torch.zeros(48, 40))
    _check(zeros, Direction(NVFP4, None), Direction(NVFP4, None, values_dtype=torch.float32))
    nan = on_device(torch.full((16, 32), NAN))
    _check(nan, Direction(NVFP4, None), Direction(NVFP4_SR, 1))


def _block(spec, seed=None, hadamard=None, hadamard_seed=0):
    return Direction(spec, seed, hadamard, hadamard_seed, torch.float32, block_values=True)


@pytest.mark.parametrize(("row_h", "col_h"), [(None, None), (None, 16), (32, 16)])
def test_block_values_are_the_references_q_times_s(row_h, col_h):
    """Block values (a two-level spec's q * s, without the tensor scale) both ways, with each
    direction's amax; 1-D blocks, transforms, SR, and the edge cases of two-level scales."""
    x = rows_over_binades(70, 100, seed=13)
    x[33, :] = 1e-40
    x[34, 0] = 3e38
    x[5, 7] = NAN
    row, col = _block(NVFP4, None, row_h, 41), _block(NVFP4_SR, 42, col_h, 43)
    row_out, col_out = quantize_pair(x, row, col)
    _assert_direction(row_out, _reference(x, row, 1), "row block values")
    _assert_direction(col_out, _reference(x, col, 0), "column block values")
    for out, d, axis in ((row_out, row, 1), (col_out, col, 0)):
        reference = quantize(x, d.spec, axis, d.seed, hadamard=d.hadamard,
                             hadamard_seed=d.hadamard_seed, backend="torch")  # fmt: skip
        assert_bits(out.tensor_amax.reshape(()), reference.tensor_amax, "amax")
    zeros = on_device(torch.zeros(48, 40))
    _check(zeros, _block(NVFP4), _block(NVFP4))


def test_block_values_of_square_tiles_and_errors():
    x = rows_over_binades(70, 100, seed=14)
    _check(x, _block(NVFP4_2D), _block(NVFP4_2D.replace(rounding="sr"), 6))
    packed = Direction(NVFP4, None, block_values=True)
    with pytest.raises(ValueError, match="block values are values"):
        quantize_pair(x, packed, None)
    with pytest.raises(ValueError, match="re-quantizes the row direction's whole values"):
        quantize_pair(x, _block(NVFP4), Direction(MXFP4, None), torch.float32)


@pytest.mark.parametrize("shape", [(64, 64), (70, 100), (17, 33)])
def test_square_tiles_give_the_reference_values_both_ways(shape):
    """2-D tiles: one scale per 16 x 16 square, so the two directions quantize alike."""
    x = rows_over_binades(*shape, seed=12)
    x[0, 0] = NAN
    row = Direction(NVFP4_2D, None, values_dtype=torch.float32)
    col = Direction(NVFP4_2D.replace(rounding="sr", scale_rule="ceil"), 5, None, 0, torch.float32)
    _check(x, row, col)
    row_out, col_out = quantize_pair(x, row, Direction(NVFP4_2D, None, None, 0, torch.float32))
    assert_bits(row_out.values, col_out.values, "a weight and its transpose")


def test_bfloat16_input_and_values():
    x = rows_over_binades(64, 64, seed=9).to(torch.bfloat16)
    row = Direction(MXFP4, None, values_dtype=torch.bfloat16)
    _check(x, row, Direction(CEIL, None))


def _bf16_edges(rows: int, cols: int, seed: int) -> torch.Tensor:
    """float32 values bfloat16 rounds every way: random ones, ties to even up and down, the
    largest float32 (overflows to Inf), subnormals (a tie among them too), signed zeros, Inf
    and NaN, on the test device."""
    x = rows_over_binades(rows, cols, seed).cpu()
    edges = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4028235e38, -3.39e38,
                          2**-134, 3 * 2**-134, 2**-133 + 2**-141, 2**-149, -0.0, 0.0])  # fmt: skip
    x[5, : len(edges)] = edges
    x[9, 3], x[12, cols - 1], x[rows - 1, 0] = NAN, INF, -INF
    return on_device(x)


@pytest.mark.parametrize(
    "row,col,double",
    [
        (Direction(MXFP4, None, values_dtype=torch.float32), Direction(CEIL_SR, 4), None),
        (Direction(CEIL, None, values_dtype=torch.float32), Direction(CEIL_SR, 4, 32, 5), None),
        (Direction(CEIL, None), Direction(CEIL_SR, 4, values_dtype=torch.float32), torch.float32),
        (Direction(MXFP4_SR_PRESCALE, 2, 64, 3), None, None),
        # two-level: the tensor amax passes read x rounded too (pair tiles, RHT-16 slabs,
        # RHT-32 slabs both ways; a lone MS-EDEN column direction, decoded from its codes)
        (Direction(NVFP4, None, values_dtype=torch.float32), Direction(NVFP4_SR, 6), None),
        (Direction(NVFP4, None, values_dtype=torch.float32), Direction(NVFP4_SR, 6, 16, 7), None),
        (Direction(UE5M3_SR, 3, 32, 5), Direction(UE5M3_SR, 4, 32, 6), None),
        (None, Direction(EDEN, 23, 128, 24, values_dtype=torch.float32), None),
    ],
    ids=[
        "values+codes",
        "rht-cols",
        "double",
        "rht-sr-row",
        "two-level",
        "two-level-rht16",
        "two-level-rht32-both",
        "eden-decoded-cols",
    ],
)
def test_float32_read_as_bfloat16_is_the_castrows_over_binades(row, col, double):
    """read_as=bfloat16: a float32 input quantized as its bfloat16 cast, rounded in the kernels
    as torch rounds it (a two-level spec's amax pass too), bit for bit in every output (ragged
    shape, edge values)."""
    x = _bf16_edges(70, 45, seed=12)
    if any(d is not None and d.spec.whole_tensor_scale for d in (row, col)):
        # the amax (which bfloat16 moves) a value that does not flush the rest: 1001.3 -> 1000
        x = torch.where(torch.isfinite(x) & (x.abs() > 1e30), 0.5, x)
        x[2, 7] = 1001.3
    got = quantize_pair(x, row, col, double, read_as=torch.bfloat16)
    expected = quantize_pair(x.to(torch.bfloat16).float(), row, col, double)
    for got_out, expected_out in zip(got, expected, strict=True):
        assert (got_out is None) == (expected_out is None)
        for field in ("codes", "scales", "values"):
            a, b = getattr(got_out, field, None), getattr(expected_out, field, None)
            assert (a is None) == (b is None)
            if a is not None:
                assert_bits(a, b, field)


def test_read_as_refuses_what_it_does_not_round():
    x = rows_over_binades(32, 64)
    with pytest.raises(ValueError, match="rounds float32 to bfloat16"):
        quantize_pair(x, Direction(MXFP4), None, read_as=torch.float16)
    with pytest.raises(ValueError, match="rounds float32 to bfloat16"):
        quantize_pair(x.to(torch.float16), Direction(MXFP4), None, read_as=torch.bfloat16)
    same = quantize_pair(x, Direction(MXFP4), None, read_as=torch.float32)[0]  # nothing to round
    assert_bits(same.codes, quantize_pair(x, Direction(MXFP4), None)[0].codes, "codes")


def test_tiles_and_errors():
    assert pair_tile(Direction(MXFP4), Direction(MXFP4)) == (32, 64)
    assert pair_tile(None, Direction(MXFP4)) == (32, 64)
    assert pair_tile(Direction(NVFP4), Direction(NVFP4, hadamard=16)) == (32, 64)
    assert pair_tile(Direction(MXFP4, hadamard=256), Direction(MXFP4)) == (32, 256)
    assert pair_tile(Direction(MXFP4), Direction(MXFP4, hadamard=128)) == (128, 64)
    assert pair_tile(Direction(MXFP4, hadamard=256), Direction(MXFP4, hadamard=64)) == (64, 256)
    assert pair_tile(Direction(MXFP4, hadamard=256), Direction(MXFP4, hadamard=128)) is None
    assert pair_tile(Direction(MXFP4, hadamard=128), Direction(MXFP4, hadamard=128)) is None
    assert pair_tile(Direction(MXFP4, hadamard=128), None) == (16, 128)
    assert pair_tile(None, Direction(MXFP4, hadamard=256)) == (256, 8)
    wide = Direction(MXFP4, hadamard=128)
    assert launch_pair.pair_warps(16, 128, wide, None) == 4  # thin tiles: 4 along the rows
    assert launch_pair.pair_warps(128, 16, None, wide) == 2  # and 2 down the columns
    assert launch_pair.pair_warps(32, 64, Direction(MXFP4), Direction(MXFP4)) == 2
    sr24, sr8 = MXFP4.replace(rounding="sr"), MXFP4.replace(rounding="sr", sr_bits=8)
    assert launch_pair.pair_warps(32, 64, Direction(sr24, 1), Direction(sr24, 2)) == 4
    assert launch_pair.pair_warps(32, 64, Direction(MXFP4), Direction(sr24, 2)) == 2
    assert launch_pair.pair_warps(32, 64, Direction(sr8, 1), Direction(sr8, 2, 16, 3)) == 2
    x = rows_over_binades(32, 32)
    with pytest.raises(ValueError, match="2-D"):
        quantize_pair(x[None], Direction(MXFP4), None)
    with pytest.raises(ValueError, match="double quantization needs the row direction"):
        quantize_pair(x, None, Direction(MXFP4), torch.float32)
    with pytest.raises(ValueError, match="without a Hadamard transform"):
        quantize_pair(x, Direction(MXFP4, hadamard=32), Direction(MXFP4), torch.float32)
    with pytest.raises(ValueError, match="2-D tiles are quantized to values"):
        quantize_pair(x, Direction(NVFP4_2D), None)
    with pytest.raises(ValueError, match="needs the row values' amax"):
        quantize_pair(x, Direction(MXFP4, None, values_dtype=x.dtype), Direction(NVFP4), x.dtype)
    with pytest.raises(ValueError, match="one at a time"):
        quantize_pair(x, Direction(MXFP4, hadamard=256), Direction(MXFP4, hadamard=256))


@pytest.mark.parametrize(("name", "hadamard"), [("sr", 128), ("nvfp4-sr", 256), ("block64", 128)])
def test_a_lone_wide_direction_takes_a_thin_tile(name, hadamard):
    """A direction spanning 128 positions or more, alone, on tiles of 2048 values (16 or 8
    lines): the reference's bits along either axis, ragged both ways."""
    row = Direction(PAIR_SPECS[name], 7, hadamard, 8, values_dtype=torch.float32)
    col = Direction(PAIR_SPECS[name], 9, hadamard, 10)
    x = rows_over_binades(21, 300, seed=3)
    _check(x, row, None)
    _check(x.T.contiguous(), None, col)


@pytest.mark.parametrize(
    "rows, cols, col_hadamard", [(96, 128, None), (37, 70, None), (70, 45, 64), (19, 33, 16)]
)
def test_column_sums_from_the_same_read(rows, cols, col_hadamard):
    """column_sums: x's column sums, float32, beside both directions' unchanged outputs; exact
    on integer values (any order gives the same float32 sum), close to float64 otherwise."""
    row, col = Direction(MXFP4_SR, 3), Direction(CEIL, None, col_hadamard, 4, torch.float32)
    integers = on_device(torch.randint(-512, 513, (rows, cols), generator=torch.Generator()
                                       .manual_seed(rows)).float())  # fmt: skip
    for x in (integers, rows_over_binades(rows, cols, seed=rows)):
        sums = torch.full((cols,), float("nan"), device=x.device)
        row_out, col_out = quantize_pair(x, row, col, column_sums=sums)
        plain_row, plain_col = quantize_pair(x, row, col)
        assert_bits(row_out.codes, plain_row.codes, "row codes")
        assert_bits(col_out.values, plain_col.values, "column values")
        exact = x.double().sum(0)
        if x is integers:
            assert_bits(sums, exact.float(), "column sums")
        else:
            torch.testing.assert_close(sums.double(), exact, rtol=1e-6, atol=1e-6 * float(
                x.abs().sum(0).max()))  # fmt: skip


def test_column_sums_left_for_the_gradients_launch():
    """A ColumnSums keeps the tiles' partial sums, one per row tile of 32, which the gradients
    launch adds up: the same totals on integers as the sums the launcher adds itself."""
    from fp4cli.kernels.elementwise.gradients import widen_gradients
    from fp4cli.kernels.host.tiling import ColumnSums

    row, col = Direction(MXFP4_SR, 3), Direction(CEIL, None, None, 4, torch.float32)
    x = on_device(torch.randint(-512, 513, (70, 45), generator=torch.Generator().manual_seed(2))
                  .float())  # fmt: skip
    left = ColumnSums(45)
    quantize_pair(x, row, col, column_sums=left)
    assert left.partials is not None and left.tiles == 3  # 70 rows: three tiles of 32
    totals = widen_gradients([], left, round_sums=False).sums
    assert_bits(totals, x.double().sum(0).float(), "column sums")
    with pytest.raises(ValueError, match="column sums of 44 columns for 45"):
        quantize_pair(x, row, col, column_sums=ColumnSums(44))


def test_column_sums_must_be_float32_columns():
    x = rows_over_binades(32, 64)
    for wrong in (torch.empty(63), torch.empty(64, dtype=torch.float16)):
        with pytest.raises(ValueError, match="column_sums must be float32 of shape"):
            quantize_pair(x, Direction(MXFP4), None, column_sums=on_device(wrong))
