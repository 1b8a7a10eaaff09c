"""Outer-block two-level scales in the kernels (`QuantSpec.outer_block`, TetraJet-v2's FP32
scale per 128 values over E4M3 scales per 16) against the reference quantizer, bit for bit:
the single-direction kernel along any axis, the pair kernel in both directions (double
quantization into an outer-block spec included), edge values per outer block, and the
configurations the kernels refuse."""

import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.quant.backend import KERNEL_OUTER_MAX, kernel_gap
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

launch = pytest.importorskip("fp4cli.kernels.quantization.launch")
launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
Direction, quantize_pair = launch_pair.Direction, launch_pair.quantize_pair

OUTER128 = QuantSpec.preset("nvfp4-outer128")
OUTER_SPECS = {
    "outer128": OUTER128,
    "outer128-sr": OUTER128.replace(rounding="sr"),
    "outer128-ceil": OUTER128.replace(scale_rule="ceil"),
    "outer128-away": OUTER128.replace(rounding="away"),
    "outer128-4over6": OUTER128.replace(four_over_six=True),
    "outer32": OUTER128.replace(outer_block=32),
    "outer-is-block": OUTER128.replace(outer_block=16),
    "ue5m3-block32-outer256-sr": QuantSpec(
        scale="ue5m3", block=32, tensor_scale=True, outer_block=256, rounding="sr"
    ),
    "e1m2-outer64": OUTER128.replace(element="e1m2", outer_block=64),
}


def outer_extremes() -> torch.Tensor:
    """Rows of three outer blocks of 128 whose amaxes make each block's G extreme on its own:
    zeros, subnormal values, FLT_MAX (blocks far below it scale to 0), one block 2^100 above
    the rest, next to ordinary outer blocks; a ragged fourth outer block."""
    return runs_at_extremes(400, 40, slice(256, 384), 2.0**100, 384)


@pytest.mark.parametrize("spec_name", OUTER_SPECS)
@pytest.mark.parametrize("case", ["edge", "extremes", "ragged"])
def test_each_outer_block_scales_its_own_blocks(spec_name, case):
    x = outer_extremes() if case == "extremes" else line_cases()[case]
    check_backends_agree(x, OUTER_SPECS[spec_name], seed=17)


@pytest.mark.parametrize(("shape", "axis"), GROUP_SHAPES_AND_AXES, ids=str)
def test_any_axis_and_shape(shape, axis):
    x = on_device(seeded_normal(shape, 5) * 3)
    check_backends_agree(x, OUTER128.replace(rounding="sr"), axis=axis, seed=9)


@pytest.mark.parametrize("hadamard", [16, 128])
def test_outer_blocks_of_the_transformed_tensor(hadamard):
    x = rows_over_binades(9, 300, seed=4)
    check_backends_agree(x, OUTER128, hadamard=hadamard, hadamard_seed=12, seed=1)
    check_backends_agree(x.T.contiguous(), OUTER128, axis=0, hadamard=16, hadamard_seed=3)


def test_the_widest_outer_block_the_kernels_take():
    spec = OUTER128.replace(outer_block=KERNEL_OUTER_MAX)
    check_backends_agree(rows_over_binades(3, 2100, seed=6), spec, seed=2)


def test_nan_and_inf_leave_their_outer_blocks_amax_alone():
    """A block with NaN or Inf is NaN, and its finite values still count in its outer
    block's amax, as the reference counts them; other outer blocks are untouched."""
    clean = seeded_normal((2, 256), 8)
    x = clean.clone()
    x[0, 3], x[1, 200] = NAN, -INF
    kernel = quantize(on_device(x), OUTER128, backend="triton")
    check_backends_agree(on_device(x), OUTER128)
    clean_kernel = quantize(on_device(clean), OUTER128, backend="triton")
    amax = kernel.tensor_amax.cpu()
    expected = clean.abs().masked_fill(~x.isfinite(), 0.0).unflatten(1, (2, 128)).amax(2)
    assert_bits(amax[:, ::8], expected, "outer amaxes over the finite values")
    values = kernel.dequantize(backend="triton").cpu()
    assert values[0, :16].isnan().all() and values[1, 192:208].isnan().all()
    clean_values = clean_kernel.dequantize(backend="triton").cpu()
    assert_bits(values[0, 128:], clean_values[0, 128:], "the other outer block")
    assert_bits(values[1, :128], clean_values[1, :128], "the other outer block")


def test_packed_codes_decode_from_one_amax_per_outer_block():
    """The pair kernel keeps one float32 per outer block (not per block); decoding takes
    either form."""
    x = rows_over_binades(300, 40, seed=2)
    _, col = quantize_pair(x, None, Direction(OUTER128, None))
    assert col.tensor_amax.shape == (40, 3)  # 300 rows: three outer blocks of 128
    reference = quantize(x, OUTER128, 0, backend="torch")
    assert_bits(col.tensor_amax, reference.tensor_amax[:, ::8], "outer amaxes")
    for t_amax in (col.tensor_amax, reference.tensor_amax):
        values = launch.dequantize_e2m1(
            col.codes, col.scales, t_amax, OUTER128, x.shape, 0, torch.float32
        )
        assert_bits(values, reference.dequantize(backend="torch"), "decoded")


def _fake(x, spec, axis, seed=None, hadamard=None, hadamard_seed=0):
    return fake_quantize(x, spec, axis, seed, hadamard=hadamard, hadamard_seed=hadamard_seed,
                         out_dtype=torch.float32, backend="torch")  # fmt: skip


@pytest.mark.parametrize("shape", [(130, 300), (64, 96), (300, 33)])
def test_pair_both_directions_with_double_quantization(shape):
    """TetraJet-v2's W pair: the forward operand along the rows (RNE), the grad_input operand
    down the columns re-quantized from it with SR and a 16-point transform; and X's, with the
    column direction packed."""
    x = rows_over_binades(*shape, seed=5)
    x[7, 3] = NAN
    sr = OUTER128.replace(rounding="sr")
    row = Direction(OUTER128, None, values_dtype=torch.float32)
    col = Direction(sr, 21, 16, 22, values_dtype=torch.float32)
    assert launch_pair.pair_tile(row, col) is None  # two launches by default (pair_tile)
    row_out, col_out = quantize_pair(x, row, col, torch.float32, (128, 128))
    row_values = _fake(x, OUTER128, 1)
    assert_same_up_to_zero_sign(row_out.values, row_values, "row values")
    assert_same_up_to_zero_sign(
        col_out.values, _fake(row_values, sr, 0, 21, 16, 22), "column values"
    )
    _, packed = quantize_pair(x, row, Direction(sr, 21, 16, 22), torch.float32, (128, 128))
    reference = quantize(row_values, sr, 0, 21, hadamard=16, hadamard_seed=22, backend="torch")
    assert_bits(packed.codes, reference.codes, "column codes")
    assert_bits(packed.scales, reference.scales, "column scale codes")
    assert_bits(packed.tensor_amax, reference.tensor_amax[:, ::8], "column outer amaxes")


def test_a_lone_outer_direction_takes_a_thin_tile():
    row = Direction(OUTER128, None, values_dtype=torch.float32)
    col = Direction(OUTER128.replace(outer_block=256), None)
    assert launch_pair.pair_tile(row, None) == (16, 128)
    assert launch_pair.pair_tile(None, col) == (256, 8)
    x = rows_over_binades(300, 40, seed=8)
    assert_same_up_to_zero_sign(
        quantize_pair(x, row, None)[0].values, _fake(x, OUTER128, 1), "row alone"
    )


def test_what_the_kernels_refuse():
    for outer in (48, 2048):
        spec = OUTER128.replace(outer_block=outer)
        assert kernel_gap(spec, torch.float32) == (
            f"outer_block {outer} (kernels: a power of two up to {KERNEL_OUTER_MAX})"
        )
    assert kernel_gap(OUTER128, torch.float32) is None
