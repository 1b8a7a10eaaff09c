"""The kernels' stochastic rounding at 8 and 16 bits (the carry rule, `QuantSpec.sr_bits`)
against the reference, bit for bit: one Philox call per group of 128 / bits elements and one per
element, along either axis, ragged, after a Hadamard transform, in both directions of the pair
kernel with double quantization, E1M2 elements, and the edge cases of the grid."""

from __future__ import annotations

import pytest
import torch

from fp4cli.quant import QuantSpec
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    INF,
    NAN,
    assert_bits,
    check_backends_agree,
    on_device,
    rows_over_binades,
    seeded_normal,
)

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
Direction, quantize_pair = launch_pair.Direction, launch_pair.quantize_pair

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

SPECS = {
    "mxfp4": QuantSpec.preset("mxfp4", rounding="sr"),
    "mxfp4-prescale": QuantSpec.preset("mxfp4", rounding="sr", sr_prescale=0.75),
    "nvfp4": QuantSpec.preset("nvfp4", rounding="sr"),
    "e1m2-ue5m3": QuantSpec(
        element="e1m2", scale="ue5m3", block=16, rounding="sr", tensor_scale=True
    ),  # fmt: skip
}
# (shape, axis): contiguous extents that are multiples of 16 (one Philox call per group) or not
PATHS = {
    "last-axis-grouped": ((5, 64), -1),
    "last-axis-ragged": ((5, 45), -1),
    "axis0-grouped": ((37, 16), 0),
    "axis0-per-element": ((37, 6), 0),
}


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", list(SPECS))
def test_one_direction_matches_the_reference(name, path, bits):
    shape, axis = PATHS[path]
    x = on_device(seeded_normal(shape, 3) * 4)
    spec = SPECS[name].replace(sr_bits=bits)
    for seed in (0, 2**40 + 7):
        check_backends_agree(x, spec, axis=axis, seed=seed)
    tensor_seed = on_device(torch.tensor(-(2**62) - 3, dtype=torch.int64))
    check_backends_agree(x, spec, axis=axis, seed=tensor_seed)


@pytest.mark.parametrize("bits", [8, 16])
def test_after_a_hadamard_transform(bits):
    x = on_device(seeded_normal((8, 45), 4) * 10)
    for name in ("mxfp4", "nvfp4"):
        spec = SPECS[name].replace(sr_bits=bits)
        check_backends_agree(x, spec, axis=-1, seed=9, hadamard=32, hadamard_seed=5)
        check_backends_agree(x.T.contiguous(), spec, axis=0, seed=9, hadamard=16, hadamard_seed=5)


def _reference(x, d, axis):
    from fp4cli.quant import fake_quantize, quantize

    args = dict(hadamard=d.hadamard, hadamard_seed=d.hadamard_seed, backend="torch")
    if d.values_dtype is not None:
        return fake_quantize(x, d.spec, axis, d.seed, out_dtype=d.values_dtype, **args)
    return quantize(x, d.spec, axis, d.seed, **args)


def _same(out, reference) -> bool:
    """A direction's output equals the reference's bit for bit (its values up to the sign of
    a zero, which the reference keeps and the kernels do not)."""
    if isinstance(reference, torch.Tensor):
        zero = reference == 0
        assert_bits(torch.where(zero, 0.0, out.values), torch.where(zero, 0.0, reference), "values")
    else:
        assert_bits(out.codes, reference.codes, "codes")
        assert_bits(out.scales, reference.scales, "scale codes")
    return True


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("shape", [(64, 64), (70, 100), (33, 7)])
@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "e1m2-ue5m3"])
def test_both_directions_of_the_pair_kernel(name, shape, bits):
    spec = SPECS[name].replace(sr_bits=bits)
    x = rows_over_binades(*shape)
    row, col = Direction(spec, 11, values_dtype=torch.float32), Direction(spec, 12)
    row_out, col_out = quantize_pair(x, row, col)
    assert _same(row_out, _reference(x, row, 1)) and _same(col_out, _reference(x, col, 0))


@pytest.mark.parametrize("bits", [8, 16])
def test_pair_with_transforms_and_double_quantization(bits):
    spec = SPECS["mxfp4"].replace(sr_bits=bits)
    x = rows_over_binades(64, 96, seed=2)
    row = Direction(spec, 3, 32, 4, values_dtype=torch.float32)
    col = Direction(spec, 5, 16, 6)
    row_out, col_out = quantize_pair(x, row, col)
    assert _same(row_out, _reference(x, row, 1)) and _same(col_out, _reference(x, col, 0))
    row = Direction(spec, 3, values_dtype=torch.float32)
    col = Direction(spec.replace(scale_rule="ceil"), 5, values_dtype=torch.float32)
    _, doubled = quantize_pair(x, row, col, torch.float32)
    assert _same(doubled, _reference(_reference(x, row, 1), col, 0))


@pytest.mark.parametrize("bits", [8, 16])
def test_zeros_saturation_subnormals_non_finite_and_extreme_scales(bits):
    spec = SPECS["mxfp4"].replace(sr_bits=bits)
    x = rows_over_binades(64, 64, seed=7)
    x[:32, :32] = 0.0
    x[32, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4)  # grid midpoints
    x[33, :] = 1e-40  # subnormal float32
    x[34, :] = 3e38
    x[35, :32] = torch.tensor([7.9, -7.9, 6.0, 0.26] * 8)  # saturating under the floor rule
    x[40, 3], x[41, 70 % 64] = NAN, INF
    for seed in (1, 2):
        check_backends_agree(x, spec, axis=-1, seed=seed)
        check_backends_agree(x, SPECS["nvfp4"].replace(sr_bits=bits), axis=0, seed=seed)
    row, col = Direction(spec, 3, values_dtype=torch.float32), Direction(spec, 4)
    row_out, col_out = quantize_pair(x, row, col)
    assert _same(row_out, _reference(x, row, 1)) and _same(col_out, _reference(x, col, 0))


@pytest.mark.parametrize("bits", [8, 16])
def test_sums_that_land_on_the_grid_exactly(bits):
    """Magnitudes on multiples of the carry's unit below 2 (each 32-block's 4.0 makes its
    scale 1): for about one value in 2^bits the field carries the sum exactly onto 0.5, 1, 1.5
    or 2, where the truncation keeps it."""
    spec = SPECS["mxfp4"].replace(sr_bits=bits)
    unit = 2.0 ** -(bits + 1)  # E2M1's step below 2 (0.5) times 2^-bits
    steps = torch.randint(int(0.25 / unit), int(2 / unit), (128, 128), generator=_generator(5))
    x = steps * unit * (1 - 2 * torch.randint(0, 2, (128, 128), generator=_generator(6)))
    x[:, ::32] = 4.0
    x[::32, :] = 4.0
    x = on_device(x)
    for seed in (1, 2):
        check_backends_agree(x, spec, axis=-1, seed=seed)
        check_backends_agree(x, spec, axis=0, seed=seed)
    row, col = Direction(spec, 3), Direction(spec, 4, values_dtype=torch.float32)
    row_out, col_out = quantize_pair(x, row, col)
    assert _same(row_out, _reference(x, row, 1)) and _same(col_out, _reference(x, col, 0))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
