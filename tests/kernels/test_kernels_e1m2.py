"""The quantize, pair and dequantize kernels on E1M2 elements (the uniform grid +-{0, 0.5, ..,
3.5}, ufp4's) against the reference quantizer, bit for bit, and against the grid by hand: ties,
saturation, stochastic rounding's mean, the guide (interpreter on the CPU, or a GPU)."""

import math

import pytest
import torch

from fp4cli.linear.fast import fast_gap
from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.recipes import load_recipe
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    assert_bits,
    edge_blocks,
    on_device,
    seeded_normal,
)
from tests.kernel_checks import assert_same_up_to_zero_sign, check_backends_agree

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
Direction, quantize_pair = launch_pair.Direction, launch_pair.quantize_pair

E1M2 = QuantSpec(element="e1m2")  # E8M0 scale per 32, floor rule, RNE
SPECS = {
    "e8m0": E1M2,
    "e8m0-ceil": E1M2.replace(scale_rule="ceil"),
    "e8m0-sr": E1M2.replace(rounding="sr"),
    "e8m0-sr-prescale": E1M2.replace(rounding="sr", sr_prescale=0.75),
    "e8m0-away": E1M2.replace(rounding="away"),
    "ue5m3-ceil": E1M2.replace(scale="ue5m3", scale_rule="ceil"),
    "ufp4": QuantSpec.preset("nvfp4", element="e1m2"),  # UE4M3 per 16, FP32 tensor scale
    "ufp4-sr": QuantSpec.preset("nvfp4", element="e1m2", rounding="sr"),
    "ufp4-away-block64": QuantSpec.preset("nvfp4", element="e1m2", rounding="away", block=64),
}
GRID = torch.arange(8) * 0.5  # the magnitudes, code = 2 |value|


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("axis", [0, 1])
def test_the_kernels_match_the_reference(name, axis):
    check_backends_agree(edge_blocks(), SPECS[name], axis=axis, seed=11)


@pytest.mark.parametrize("name", ["e8m0", "ufp4-sr"])
def test_with_a_hadamard_transform(name):
    check_backends_agree(edge_blocks(seed=3), SPECS[name], seed=5, hadamard=16, hadamard_seed=9)


@pytest.mark.parametrize("rounding", ["rne", "away"])
def test_ties_and_saturation_by_hand(rounding):
    """With the anchor 3.5 (the grid's largest) every block's E8M0 scale is 1 under the floor
    rule: each tie k + 0.25 (k = 0, 0.5, .., 3) rounds to the even code (or away from zero),
    and values in (3.5, 4) clip to 3.5."""
    ties = GRID[:-1] + 0.25
    up = ties + 0.25
    even = torch.where((ties * 2).floor() % 2 == 0, ties - 0.25, up)
    expected = up if rounding == "away" else even
    clipped = torch.tensor([3.6, 3.75, 3.99])
    x = torch.cat([torch.tensor([3.5]), ties, -ties, clipped])
    rounded = torch.cat([torch.tensor([3.5]), expected, -expected, torch.full((3,), 3.5)])
    values = fake_quantize(
        on_device(x).unsqueeze(0), E1M2.replace(rounding=rounding), backend="triton"
    )
    assert_same_up_to_zero_sign(values, on_device(rounded).unsqueeze(0), "ties")
    # the ceil rule takes scale 2 for an amax in (3.5, 4): nothing clips
    ceil = fake_quantize(on_device(clipped).unsqueeze(0), SPECS["e8m0-ceil"], backend="triton")
    assert torch.equal(ceil.cpu(), torch.tensor([[4.0, 4.0, 4.0]]))


def test_stochastic_rounding_is_unbiased_and_reproducible():
    """The mean of N roundings of v is within 5 standard deviations (spacing 0.5) of v; the
    same seed gives the same bits, another seed other bits."""
    rows, seeds = 256, 4
    values = torch.linspace(-3.4, 3.45, 31)
    x = on_device(torch.cat([torch.full((rows, 1), 3.5), values.expand(rows, -1)], dim=1))
    spec = SPECS["e8m0-sr"]
    total = torch.zeros(31, dtype=torch.float64)
    for seed in range(seeds):
        total += fake_quantize(x, spec, seed=seed, backend="triton").cpu()[:, 1:].double().sum(0)
    mean = total / (rows * seeds)
    tolerance = 5 * 0.5 / (2 * math.sqrt(rows * seeds))
    assert (mean - values.double()).abs().max() < tolerance

    def rounded(seed):
        return fake_quantize(x, spec, seed=seed, backend="triton")

    assert torch.equal(rounded(3), rounded(3)) and not torch.equal(rounded(3), rounded(4))


def test_the_guide_picks_the_nearer_grid_point():
    x = edge_blocks(seed=5)
    guide = x + on_device(seeded_normal(tuple(x.shape), 6)) * x.abs() * 0.2
    for spec in (SPECS["e8m0-ceil"], SPECS["ufp4"]):
        kernel = fake_quantize(x, spec, guide=guide, backend="triton")
        assert_same_up_to_zero_sign(
            kernel, fake_quantize(x, spec, guide=guide, backend="torch"), "guided"
        )


@pytest.mark.parametrize("hadamard", [None, 16])
def test_the_pair_kernel_writes_both_directions(hadamard):
    """ufp4's pairs: codes one way, values the other, two-level, with or without RHT-16 (the
    tensor amax passes transform too)."""
    x = edge_blocks(64, 96, seed=8)
    x[4:7] = 1.0  # the pair's amax pass reads the tensor: finite values only
    for spec in (SPECS["ufp4"], SPECS["ufp4-sr"], SPECS["e8m0-sr"]):
        row = Direction(spec, 3, hadamard, 5, torch.float32)
        col = Direction(spec, 4, hadamard, 6)
        row_out, col_out = quantize_pair(x, row, col)
        args = dict(hadamard=hadamard, hadamard_seed=5, backend="torch")
        reference = fake_quantize(x, spec, 1, 3, **args)
        assert_same_up_to_zero_sign(row_out.values, reference, "row values")
        col_reference = quantize(x, spec, 0, 4, hadamard=hadamard, hadamard_seed=6, backend="torch")
        assert_bits(col_out.codes, col_reference.codes, "column codes")
        assert_bits(col_out.scales, col_reference.scales, "column scale codes")


def test_ufp4_runs_on_the_fast_executor():
    assert fast_gap(load_recipe("ufp4").linear) is None
