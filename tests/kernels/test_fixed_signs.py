"""A Hadamard transform with fixed signs (`hadamard: {random: false, signs: [...]}`, and the
deterministic transform, no signs): the reference's rotation against the matrix
TransformerEngine builds, and every kernel that fuses a transform against the reference, bit
for bit (interpreter on the CPU, or a GPU)."""

import pytest
import torch

from fp4cli.linear.fast import fast_gap
from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.techniques.hadamard import TE_SIGNS_16, FixedSigns, hadamard_matrix, rht
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    INF,
    MXFP4,
    MXFP4_SR,
    NAN,
    NVFP4,
    NVFP4_SR,
    assert_bits,
    on_device,
    rows_over_binades,
    seeded_normal,
)
from tests.kernel_checks import assert_same_up_to_zero_sign

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
launch_amax = pytest.importorskip("fp4cli.kernels.quantization.launch_amax")
Direction, pair_amax, pair_tile, quantize_pair = (
    launch_pair.Direction,
    launch_amax.pair_amax,
    launch_pair.pair_tile,
    launch_pair.quantize_pair,
)

TE = FixedSigns.of(TE_SIGNS_16)
# 16: TransformerEngine's; 32: a mask with its top bit set (negative as a signed int32)
SIGNS = {
    "te-16": (16, TE),
    "none-32": (32, FixedSigns()),
    "top-bit-32": (32, FixedSigns(0xDEADBEEF)),
}
UE5M3_SR = QuantSpec.preset("mxfp4-ue5m3", rounding="sr", scale_rule="ceil")


def test_the_fixed_rotation_is_transformer_engines_matrix():
    """R = diag(signs) H_16 / 4, applied to each 16-block as a row vector times R: the matrix
    TransformerEngine's NVFP4 recipe builds from its sign vector."""
    assert TE.flips == 0xD7E8  # bit j set where sign j is -1
    assert FixedSigns(TE.flips).vector(16).tolist() == list(map(float, TE_SIGNS_16))
    x = seeded_normal((8, 48), 0).to(torch.float64)
    rotation = (
        torch.diag(torch.tensor(TE_SIGNS_16, dtype=torch.float64)) @ hadamard_matrix(16).double()
    )
    expected = (x.reshape(8, 3, 16) @ rotation).reshape(8, 48)
    torch.testing.assert_close(rht(x.float(), 1, 16, TE).double(), expected, rtol=0, atol=1e-5)
    # the same rotation at every call; no signs is the plain matrix, exactly as `None`
    assert torch.equal(rht(x.float(), 1, 16, TE), rht(x.float(), 1, 16, TE))
    assert torch.equal(rht(x.float(), 0, 32, FixedSigns()), rht(x.float(), 0, 32, None))
    assert not torch.equal(rht(x.float(), 1, 16, TE), rht(x.float(), 1, 16, None))


@pytest.mark.parametrize("signs", SIGNS)
@pytest.mark.parametrize("spec", ["mxfp4-sr", "nvfp4"])
@pytest.mark.parametrize("axis", [0, 1])
def test_the_quantize_kernel_fuses_fixed_signs(signs, spec, axis):
    """Codes, scales and values, one-level with SR and two-level (whose amax pass transforms
    too), along either axis of a ragged tensor."""
    size, fixed = SIGNS[signs]
    spec = {"mxfp4-sr": MXFP4_SR, "nvfp4": NVFP4}[spec]
    x = rows_over_binades(37, 70, seed=size)
    args = dict(axis=axis, seed=5, hadamard=size, hadamard_seed=fixed)
    kernel, reference = (
        quantize(x, spec, **args, backend="triton"),
        quantize(x, spec, **args, backend="torch"),
    )
    assert_bits(kernel.codes, reference.codes, "codes")
    assert_bits(kernel.scales, reference.scales, "scale codes")
    if spec.tensor_scale:
        assert_bits(kernel.tensor_amax, reference.tensor_amax, "tensor amax")
    values = fake_quantize(x, spec, **args, backend="triton")
    assert_same_up_to_zero_sign(values, fake_quantize(x, spec, **args, backend="torch"), "values")


def test_fixed_signs_on_non_finite_zero_and_tiny_inputs():
    x = rows_over_binades(32, 64, seed=9)
    x[3, 5], x[10, 17], x[20, 40] = NAN, INF, -INF
    for tensor in (x, on_device(torch.zeros(16, 32)), rows_over_binades(16, 32, seed=2) * 1e-42):
        for spec in (MXFP4, NVFP4_SR):
            args = dict(axis=1, seed=3, hadamard=16, hadamard_seed=TE)
            assert_same_up_to_zero_sign(
                fake_quantize(tensor, spec, **args, backend="triton"),
                fake_quantize(tensor, spec, **args, backend="torch"),
                "values",
            )


def _pair_check(x, row, col):
    row_out, col_out = quantize_pair(x, row, col, tile=pair_tile(row, col))
    for out, d, axis in ((row_out, row, 1), (col_out, col, 0)):
        if d is None:
            continue
        reference = fake_quantize(x, d.spec, axis, d.seed, hadamard=d.hadamard,
                                  hadamard_seed=d.hadamard_seed, backend="torch")  # fmt: skip
        assert_same_up_to_zero_sign(out.values, reference, f"values along axis {axis}")


@pytest.mark.parametrize("shape", [(64, 96), (19, 45)])
def test_the_pair_kernel_and_its_amax_passes_take_fixed_signs(shape):
    """nvidia-nvfp4's weight-gradient pairs: the transform down the columns only (the 16-slab
    amax), beside random signs the other way (the tile amax), and 32-point fixed signs both
    ways (the 32-slab amax)."""
    x = rows_over_binades(*shape, seed=7)
    _pair_check(x, Direction(NVFP4, None, values_dtype=torch.float32),
                Direction(NVFP4_SR, 4, 16, TE, torch.float32))  # fmt: skip
    _pair_check(x, Direction(NVFP4_SR, 2, 16, 99, torch.float32),
                Direction(NVFP4, None, 16, TE, torch.float32))  # fmt: skip
    top = FixedSigns(0xDEADBEEF)
    _pair_check(x, Direction(UE5M3_SR, 1, 32, top, torch.float32),
                Direction(UE5M3_SR, 2, 32, FixedSigns(), torch.float32))  # fmt: skip
    # the amax passes on their own: each direction's, after its own signs
    for row, col in (
        (Direction(NVFP4), Direction(NVFP4, None, 16, TE)),
        (Direction(UE5M3_SR, 1, 32, top), Direction(UE5M3_SR, 2, 32, FixedSigns())),
    ):
        amax = pair_amax(x, row, col, pair_tile(row, col))
        for d, axis in ((row, 1), (col, 0)):
            reference = quantize(x, d.spec, axis, d.seed, hadamard=d.hadamard,
                                 hadamard_seed=d.hadamard_seed, backend="torch")  # fmt: skip
            assert_bits(amax[1 - axis], reference.tensor_amax, f"amax along axis {axis}")


def test_fixed_and_deterministic_transforms_run_on_the_fast_executor():
    from fp4cli.recipes import load_recipe

    for name in ("nvidia-nvfp4", "mxfp4-dht"):
        assert fast_gap(load_recipe(name).linear) is None
