"""MS-EDEN in the kernels (rounding "eden", Quartet II's backward quantizer) against the
reference quantizer, bit for bit: the single-direction kernel along any axis and after a
Hadamard transform, the pair kernel both ways, edge values per correction group, and the
seed's role."""

import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize, quantize
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    GROUP_SHAPES_AND_AXES,
    INF,
    NAN,
    assert_bits,
    assert_same_up_to_zero_sign,
    check_backends_agree,
    line_cases,
    on_device,
    rows_over_binades,
    runs_at_extremes,
    seeded_normal,
)

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
Direction, quantize_pair = launch_pair.Direction, launch_pair.quantize_pair

EDEN = QuantSpec.preset("nvfp4-eden")
EDEN_SPECS = {
    "nvfp4-eden": EDEN,
    "group32": EDEN.replace(eden_group=32),
    "group-is-block": EDEN.replace(eden_group=16),
    "no-prescale": EDEN.replace(sr_prescale=1.0),
    "prescale2": EDEN.replace(sr_prescale=2.0),
    "ue5m3-block32": QuantSpec(
        scale="ue5m3", block=32, tensor_scale=True, rounding="eden", eden_group=256
    ),
}


def group_extremes() -> torch.Tensor:
    """Rows whose correction groups are all zero, subnormal, next to FLT_MAX (blocks scaled to
    0 leave the sums), a saturating block beside tiny ones, the smallest float32, and a
    ragged last group."""
    return runs_at_extremes(300, 50, slice(0, 16), 2.0**30, 256)


@pytest.mark.parametrize("spec_name", EDEN_SPECS)
@pytest.mark.parametrize("case", ["edge", "extremes", "ragged"])
def test_each_group_corrects_its_own_scales(spec_name, case):
    x = group_extremes() if case == "extremes" else line_cases()[case]
    check_backends_agree(x, EDEN_SPECS[spec_name], seed=17)


@pytest.mark.parametrize(("shape", "axis"), GROUP_SHAPES_AND_AXES, ids=str)
def test_any_axis_and_shape(shape, axis):
    x = on_device(seeded_normal(shape, 5) * 3)
    check_backends_agree(x, EDEN, axis=axis, seed=9)


@pytest.mark.parametrize("hadamard", [16, 128])
def test_after_a_hadamard_transform(hadamard):
    x = rows_over_binades(9, 300, seed=4)
    check_backends_agree(x, EDEN, hadamard=hadamard, hadamard_seed=12, seed=1)
    check_backends_agree(x.T.contiguous(), EDEN, axis=0, hadamard=128, hadamard_seed=3, seed=2)


def test_the_seed_draws_the_scales():
    """One number per block: the same seed gives the same scales, another seed other ones (the
    corrected scale lies between two grid points), and each is the reference's."""
    x = rows_over_binades(64, 256, seed=6)
    first = quantize(x, EDEN, seed=1, backend="triton")
    assert torch.equal(quantize(x, EDEN, seed=1, backend="triton").scales, first.scales)
    other = quantize(x, EDEN, seed=2, backend="triton")
    assert (other.scales != first.scales).any()
    assert torch.equal(other.codes, first.codes)  # the elements keep their rounding
    assert_bits(other.scales, quantize(x, EDEN, seed=2, backend="torch").scales, "scales")


@pytest.mark.parametrize("shape", [(130, 140), (64, 96)])
def test_pair_both_directions(shape):
    """Quartet II's dY pair: MS-EDEN after RHT-128 along the rows (values) and down the
    columns (packed), each with its seed: in one launch of 128 x 128 tiles, and in the two
    launches of thin tiles that `pair_tile` chooses."""
    x = rows_over_binades(*shape, seed=5)
    x[7, 3], x[40, 9] = NAN, INF
    row = Direction(EDEN, 21, 128, 22, values_dtype=torch.float32)
    col = Direction(EDEN, 23, 128, 24)
    assert launch_pair.pair_tile(row, col) is None
    assert launch_pair.pair_tile(row, None) == (16, 128)
    assert launch_pair.pair_tile(None, col) == (128, 16)
    row_out, col_out = quantize_pair(x, row, col, tile=(128, 128))
    alone = quantize_pair(x, row, None)[0], quantize_pair(x, None, col)[1]
    assert_bits(alone[0].values, row_out.values, "row values alone")
    assert_bits(alone[1].codes, col_out.codes, "column codes alone")
    assert_bits(alone[1].scales, col_out.scales, "column scale codes alone")
    expected = fake_quantize(x, EDEN, 1, 21, hadamard=128, hadamard_seed=22,
                             out_dtype=torch.float32, backend="torch")  # fmt: skip
    assert_same_up_to_zero_sign(row_out.values, expected, "row values")
    reference = quantize(x, EDEN, 0, 23, hadamard=128, hadamard_seed=24, backend="torch")
    assert_bits(col_out.codes, reference.codes, "column codes")
    assert_bits(col_out.scales, reference.scales, "column scale codes")
    assert_bits(col_out.tensor_amax.reshape(()), reference.tensor_amax, "column amax")
    col_values = Direction(EDEN, 23, 128, 24, values_dtype=torch.float32)
    expected = fake_quantize(x, EDEN, 0, 23, hadamard=128, hadamard_seed=24,
                             out_dtype=torch.float32, backend="torch")  # fmt: skip
    col_out = quantize_pair(x, None, col_values)[1]
    assert_same_up_to_zero_sign(col_out.values, expected, "column values")


def test_a_lone_direction_decodes_its_codes_for_values(monkeypatch):
    """A lone MS-EDEN column direction asked for values quantizes to packed codes and decodes
    them (`launch_pair._values_from_codes`): a quantize launch writing no values, then a
    decode; a lone row direction writes its values."""
    import fp4cli.kernels.quantization.launch as launch

    calls = []
    for module, name in ((launch_pair, "quantize_pair_kernel"), (launch, "dequantize_kernel")):
        monkeypatch.setattr(module, name, _Recorded(getattr(module, name), calls))
    x = rows_over_binades(40, 256, seed=8)
    quantize_pair(x, Direction(EDEN, 1, 128, 2, values_dtype=torch.float32), None)
    quantize_pair(x, None, Direction(EDEN, 3, 128, 4, values_dtype=torch.float32))
    assert [
        (name, named.get("ROW_WRITE_VALUES"), named.get("COL_WRITE_VALUES"))
        for name, named in calls
    ] == [  # fmt: skip
        ("quantize_pair_kernel", True, False),
        ("quantize_pair_kernel", False, False),
        ("dequantize_kernel", None, None),
    ]


class _Recorded:
    """A kernel that records each launch's arguments by name, then runs."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls, self.fn = kernel, calls, kernel.fn

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            named = dict(zip(self.kernel.arg_names, args, strict=True))
            self.calls.append((self.fn.__name__, named))
            return self.kernel[grid](*args, **kwargs)

        return run


@pytest.mark.parametrize("exponent", [-100, 0, 100])
def test_the_prescale_division_at_far_magnitudes(exponent):
    """Scaled by 2^exponent, the tiles' block scales fall outside (-100, 100) or inside (0) the
    range where the kernels on a GPU divide by the pre-scale with a remainder step
    (kernels/tiles/prescale.py): both ways the reference's bits, in the single-direction kernel, its
    dequantization, and the pair's row values."""
    x = rows_over_binades(16, 128, seed=3, spread=2) * 2.0**exponent
    x[2, 5] = 0.0
    check_backends_agree(x, EDEN, seed=8)
    row = Direction(EDEN, 21, 128, 22, values_dtype=torch.float32)
    expected = fake_quantize(x, EDEN, 1, 21, hadamard=128, hadamard_seed=22,
                             out_dtype=torch.float32, backend="torch")  # fmt: skip
    assert_same_up_to_zero_sign(quantize_pair(x, row, None)[0].values, expected, "row values")
