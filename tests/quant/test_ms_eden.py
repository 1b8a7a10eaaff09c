"""MS-EDEN (rounding "eden", Quartet II's backward quantizer): a case worked by hand, the seed's
role, unbiasedness over random Hadamard transforms, validation, and where it runs. The oracle
(tests/oracle.py, via test_quantize's matrix) checks it bit for bit on every kind of input."""

import pytest
import torch

from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast import fast_gap
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.backend import kernel_gap
from fp4cli.quant.two_level import scale_max
from fp4cli.recipes import load_recipe
from fp4cli.techniques.hadamard import rht_matrix

EDEN = QuantSpec.preset("nvfp4-eden")
ONE_BLOCK_GROUPS = QuantSpec(
    scale="ue4m3", block=16, tensor_scale=True, rounding="eden", eden_group=16
)


def _hand_case(rows: int) -> torch.Tensor:
    """Row 0 holds the tensor amax 1536 = 256 * 6 (so the global scales are 1); every row's
    second block holds 5 and 1.2."""
    x = torch.zeros(rows, 32)
    x[0, 0] = 1536.0
    x[:, 16], x[:, 17] = 5.0, 1.2
    return x


def test_worked_by_hand():
    # Block (5, 1.2): scale E4M3(5 / 6 = 0.833) = 0.8125, so u = (6.154, 1.477) and q = (6, 1.5)
    # (ties away; 6.154 saturates). c = (6.154^2 + 1.477^2) / (6.154 * 6 + 1.477 * 1.5)
    # = 1.02332; s * c = 0.8315 lies between the E4M3 neighbours 0.8125 and 0.875 and rounds up
    # with probability (0.8315 - 0.8125) / 0.0625 = 0.3031. Block (1536): scale 256, c = 1.
    u0, u1 = 5.0 / 0.8125, 1.2 / 0.8125
    c = (u0 * u0 + u1 * u1) / (u0 * 6.0 + u1 * 1.5)
    assert c == pytest.approx(1.02332, abs=1e-5)
    p_up = (0.8125 * c - 0.8125) / 0.0625
    assert p_up == pytest.approx(0.3031, abs=1e-4)

    x = _hand_case(4000)
    qt = quantize(x, ONE_BLOCK_GROUPS, seed=5)
    scales = qt.scale_values()
    assert scales[0, 0].item() == 256.0
    second = scales[:, 1]
    assert set(second.tolist()) == {0.8125, 0.875}
    share_up = (second == 0.875).float().mean().item()
    assert share_up == pytest.approx(p_up, abs=4 * (p_up * (1 - p_up) / 4000) ** 0.5)
    out = qt.dequantize()
    assert set(out[:, 16].tolist()) == {6 * 0.8125, 6 * 0.875}  # q = 6 either way
    assert set(out[:, 17].tolist()) == {1.5 * 0.8125, 1.5 * 0.875}
    # the mean over the draws keeps the block's projection on the source, in grid units
    mean_scale = second.mean().item()
    assert mean_scale * (u0 * 6 + u1 * 1.5) / 0.8125 == pytest.approx(u0 * u0 + u1 * u1, rel=2e-3)


def test_tensor_scale_targets_256():
    assert scale_max(EDEN) == 256.0
    assert scale_max(EDEN.replace(scale="ue5m3")) == 32768.0
    qt = quantize(_hand_case(1), ONE_BLOCK_GROUPS, seed=0)
    assert qt.scale_values()[0, 0].item() == 256.0


def test_reproducible_by_seed():
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(1))
    a, b = quantize(x, EDEN, seed=3), quantize(x, EDEN, seed=3)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)
    assert torch.equal(fake_quantize(x, EDEN, seed=3), a.dequantize())
    other = quantize(x, EDEN, seed=4)
    assert torch.equal(other.codes, a.codes)  # the elements are rounded to nearest
    assert not torch.equal(other.scales, a.scales)  # only the scales are drawn
    torch.manual_seed(9)
    first = fake_quantize(x, EDEN)  # no seed: drawn from torch's random state
    torch.manual_seed(9)
    assert torch.equal(fake_quantize(x, EDEN), first)


def _rotated_estimates(spec: QuantSpec, draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (4 x 128, channels of growing size), and its estimate R^T Q(R x) for `draws` random
    Hadamard transforms R (the draws quantized as one tensor, one seed)."""
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(0))
    x = x * torch.linspace(0.1, 3.0, 128)
    rotations = torch.stack([rht_matrix(128, 100 + i) for i in range(draws)])  # (N, 128, 128)
    rotated = torch.einsum("rc,ncd->nrd", x, rotations).reshape(-1, 128)
    quantized = fake_quantize(rotated, spec, seed=7).reshape(draws, 4, 128)
    return x, torch.einsum("nrd,ncd->nrc", quantized, rotations)


def _bias_stats(spec: QuantSpec, draws: int = 512) -> tuple[float, float]:
    """(mean of <x_hat, x> / <x, x> minus 1, |mean(x_hat) - x| over its noise floor
    sqrt(mse / draws))."""
    x, estimates = _rotated_estimates(spec, draws)
    projection = (estimates * x).sum(-1) / (x * x).sum(-1)
    mse = (estimates - x).square().mean()
    floor = (mse / draws).sqrt()
    rms_bias = (estimates.mean(0) - x).square().mean().sqrt()
    return projection.mean().item() - 1, (rms_bias / floor).item()


def test_unbiased_over_random_hadamard_transforms():
    # Over 512 random Hadamard transforms (and scale draws), MS-EDEN's projection on x is 1
    # within 0.0015 (its standard error: 0.00025) and its mean estimate is as close to x as
    # noise alone allows (bias / noise floor < 1.15). Rounding to nearest shrinks (about
    # -0.45%) and stays away from x; so does SR under a scale rounded to nearest, which clips.
    eden_shift, eden_ratio = _bias_stats(EDEN)
    assert abs(eden_shift) < 0.0015 and eden_ratio < 1.15
    rne_shift, rne_ratio = _bias_stats(QuantSpec.preset("nvfp4"))
    assert rne_shift < -0.003 and rne_ratio > 1.25
    sr_shift, _ = _bias_stats(QuantSpec.preset("nvfp4", rounding="sr"), draws=256)
    assert sr_shift < -0.002


def test_lower_error_than_stochastic_rounding():
    x, eden = _rotated_estimates(EDEN, 32)
    _, sr = _rotated_estimates(QuantSpec.preset("nvfp4", rounding="sr"), 32)
    assert (eden - x).square().mean() < 0.6 * (sr - x).square().mean()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rounding": "eden"}, "needs tensor_scale"),
        ({"rounding": "eden", "tensor_scale": True, "scale": "ue4m3", "four_over_six": True},
         "four_over_six"),
        ({"rounding": "eden", "tensor_scale": True, "scale": "ue4m3", "block": 16,
          "tile2d": True}, "tile2d"),
        ({"rounding": "eden", "tensor_scale": True, "scale": "ue4m3", "block": 16,
          "eden_group": 24}, "eden_group"),
        ({"rounding": "eden", "tensor_scale": True, "scale": "ue4m3", "block": 16,
          "eden_group": 2048}, "eden_group"),
        ({"rounding": "eden", "tensor_scale": True, "scale": "ue4m3", "eden_group": "128"},
         "eden_group"),
        ({"eden_group": 64}, "only applies with rounding 'eden'"),
        ({"rounding": "eden", "tensor_scale": True, "scale": "ue4m3", "sr_prescale": 2.5},
         "sr_prescale"),
        ({"rounding": "sr", "sr_prescale": 1.01}, "sr_prescale"),
    ],
    ids=str,
)  # fmt: skip
def test_validation(changes, message):
    with pytest.raises(SpecError, match=message):
        QuantSpec(**changes)


def test_resolved_form_unchanged_and_short_label():
    assert "eden_group" in EDEN.to_dict()
    assert EDEN.short() == "e2m1/ue4m3/16/floor/eden/pre1.01202/ts/group128"
    recipe = load_recipe("nvfp4")
    assert "eden_group" not in str(recipe.to_dict())  # left out while at its default


def test_the_kernels_and_the_fast_executor_run_it():
    assert kernel_gap(EDEN, torch.float32) is None
    assert fast_gap(LinearConfig(grad_input_dy=EDEN)) is None
    assert fast_gap(load_recipe("quartet2").linear) is None
    assert kernel_gap(EDEN.replace(eden_group=48), torch.float32) == (
        "eden_group 48 (kernels: a power of two)"
    )


def test_sums_need_no_order():
    """The correction's sums are of terms truncated to multiples of 2^-16: integers, whose
    sum is the same in any order (a kernel's tree, or torch's); c is their ratio, rounded to
    float64 then float32."""
    from fractions import Fraction
    from math import floor

    from fp4cli.quant.ms_eden import group_corrections

    generator = torch.Generator().manual_seed(3)
    units = (
        torch.rand(4, 16, 16, generator=generator)
        * 6
        * torch.exp2(-4 * torch.rand(4, 16, 1, generator=generator))
    )
    q = torch.round(units)
    usable = torch.ones(4, 16, dtype=torch.bool)
    c = group_corrections(units, q, usable, 8)
    # the blocks of each group, and each block's elements, in reverse order
    shuffled = [t.unflatten(1, (2, 8)).flip(2, 3).flatten(1, 2) for t in (units, q)]
    assert torch.equal(group_corrections(*shuffled, usable, 8), c)
    for line in range(4):
        for group in range(2):
            u = units[line, 8 * group : 8 * group + 8].flatten().tolist()
            g = q[line, 8 * group : 8 * group + 8].flatten().tolist()
            num = sum(floor(Fraction(a) ** 2 * 2**16) for a in u)
            den = sum(floor(Fraction(a) * Fraction(b) * 2**16) for a, b in zip(u, g, strict=True))
            assert den > 0
            expected = torch.tensor(float(num) / float(den), dtype=torch.float64).float()
            assert torch.equal(c[line, 8 * group], expected)
