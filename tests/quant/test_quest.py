"""QuEST's Gaussian-fitted scales (QuantSpec scale_rule "rms" / "std", rms_clip), worked by hand:
the scale is rms_clip / 6 times the block's RMS (or standard deviation), rounded down to a power
of two for E8M0 (Quartet's forward quantizer) or kept as it is for FP32 (QuEST's FP4 one);
elements round to nearest even and saturate at 6."""

import math

import pytest
import torch

from fp4cli.formats import unpack_nibbles
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.backend import kernel_gap, scale_rule_gap
from fp4cli.recipe_schema import RecipeError, _asdict
from fp4cli.recipes import load_recipe
from tests.quant.test_quantize import CASES, check_against_oracle

CLIP = 2.92247856  # QuEST's E2M1 fit: the grid's 6 at 2.92247856 standard deviations
STD = QuantSpec(block=8, scale_rule="std", rms_clip=CLIP)
RMS = STD.replace(scale_rule="rms")
# block 0: mean 0, mean square (2 * 1.21 + 2 * 0.09 + 2 * 6.76) / 8 = 2.015, std 1.4195, s =
#   0.48708 * 1.4195 = 0.691 -> 2^-1: v = 2.2, 0.6, 5.2 round to 2, 0.5, 6 (RNE, not ties).
# block 1: mean 4.5, mean square 176 / 8 = 22: std sqrt(22 - 20.25) = 1.3229, s = 0.644 ->
#   2^-1, v = 16 and 8 saturate at 6; RMS sqrt(22) = 4.690, s = 2.285 -> 2^1, v = 4 and 2.
X = torch.tensor(
    [[1.1, -1.1, 0.3, -0.3, 2.6, -2.6, 0.0, 0.0, 8.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]]
)


def test_std_scale_is_rounded_down_to_a_power_of_two():
    q = quantize(X, STD)
    assert q.scale_values().tolist() == [[0.5, 0.5]]
    assert q.scales.tolist() == [[126, 126]]  # E8M0 codes: 2^(126 - 127)
    # E2M1 codes (sign << 3 | exponent << 1 | mantissa): 2 -> 4, 0.5 -> 1, 6 -> 7
    codes = unpack_nibbles(q.codes).tolist()
    assert codes == [[4, 12, 1, 9, 7, 15, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7]]
    expected = [1.0, -1.0, 0.25, -0.25, 3.0, -3.0, 0.0, 0.0] + [3.0] * 8
    assert fake_quantize(X, STD).tolist() == [expected]


def test_rms_scale_keeps_the_mean():
    q = quantize(X, RMS)
    assert q.scale_values().tolist() == [[0.5, 2.0]]
    assert unpack_nibbles(q.codes).tolist()[0][8:] == [6] + [4] * 7  # 4 -> 6, 2 -> 4
    expected = [1.0, -1.0, 0.25, -0.25, 3.0, -3.0, 0.0, 0.0, 8.0] + [4.0] * 7
    assert fake_quantize(X, RMS).tolist() == [expected]


def test_a_tie_rounds_to_even():
    """|x| = 0.875 everywhere: std 0.875, s = 0.426 -> 2^-2, v = 3.5, a tie: to 4 (code 6);
    Quartet's kernel rounds ties toward zero (3), the documented difference."""
    x = torch.tensor([[0.875, -0.875] * 4])
    q = quantize(x, STD)
    assert q.scale_values().tolist() == [[0.25]]
    assert unpack_nibbles(q.codes).tolist() == [[6, 14] * 4]
    assert fake_quantize(x, STD).tolist() == [[1.0, -1.0] * 4]


def test_fp32_row_scale_is_the_rms_fit_itself():
    """QuEST's FP4: one FP32 scale per row. [10, 1, 1, 1]: RMS sqrt(103 / 4), s = RMS * 2.92247856
    / 6 = 2.4717; v = 4.046 -> 4 and 0.405 -> 0.5."""
    spec = QuantSpec.preset("fp4-row-rms")
    x = torch.tensor([[10.0, 1.0, 1.0, 1.0]])
    q = quantize(x, spec)
    s = torch.tensor(math.sqrt(103 / 4) * (CLIP / 6), dtype=torch.float32)
    assert torch.equal(q.scale_values(), s.reshape(1, 1))
    assert unpack_nibbles(q.codes).tolist() == [[6, 1, 1, 1]]
    assert torch.equal(fake_quantize(x, spec), torch.tensor([[4.0, 0.5, 0.5, 0.5]]) * s)


def test_padding_does_not_count():
    """A row of 3 values is padded to 4 (two codes a byte) and one of 40 to two blocks of 32:
    the RMS or std is over the tensor's values alone."""
    row = quantize(torch.tensor([[2.0, 2.0, 2.0]]), QuantSpec.preset("fp4-row-rms"))
    assert row.scale_values().item() == torch.tensor(2 * CLIP / 6, dtype=torch.float32).item()
    x = torch.tensor([[1.0, -1.0] * 20])  # block 1 holds 8 values: std 1, s 0.487 -> 2^-2
    spec = QuantSpec.preset("mxfp4-quest")
    assert quantize(x, spec).scale_values().tolist() == [[0.25, 0.25]]  # counting the pad: 2^-3


def _fitted_specs() -> list[QuantSpec]:
    specs = []
    for rule in ("rms", "std"):
        for scale in ("e8m0", "ue5m3", "ue4m3", "fp32", "bf16"):
            specs.append(QuantSpec(scale=scale, scale_rule=rule, rms_clip=CLIP))
        specs.append(QuantSpec(scale="fp32", block="row", scale_rule=rule, rms_clip=CLIP))
        specs.append(QuantSpec(element="e4m3", scale_rule=rule, rms_clip=2.5, rounding="away"))
        specs.append(QuantSpec(block=16, scale_rule=rule, rms_clip=CLIP, rounding="ties_up"))
    return specs


def case_offset(element: str) -> torch.Tensor:
    """Blocks with a large mean and a tiny spread (where E[x^2] - E[x]^2 cancels), and a row of
    40 values: padded to a second block of 32 that holds 8."""
    gen = torch.Generator().manual_seed(7)
    x = 1000.0 + 1e-3 * torch.randn(3, 64, generator=gen)
    x[1, 32:] = -(2.0**20) + torch.randn(32, generator=gen)
    x[2] = torch.randn(64, generator=gen) * 3 + 5
    return x


@pytest.mark.parametrize("case", [*CASES, "offset", "padded"])
@pytest.mark.parametrize("spec", _fitted_specs(), ids=lambda s: s.short())
def test_fitted_scales_match_the_oracle(spec, case):
    """The reference (float64 sums over the block's own values) against the oracle's exact
    moments, bit for bit: scales, codes and values, along either axis."""
    if case == "offset":
        x = case_offset(spec.element)
    elif case == "padded":
        x = torch.randn(5, 40, generator=torch.Generator().manual_seed(3)) * 4 - 1
    else:
        x = CASES[case](spec.element)
    check_against_oracle(x, spec)
    check_against_oracle(x.T.contiguous(), spec, axis=0)


def test_zero_and_non_finite_blocks():
    spec = QuantSpec.preset("mxfp4-quest")
    x = torch.zeros(2, 32)
    x[1, 3] = float("nan")
    q = quantize(x, spec)
    assert q.scales.tolist() == [[0], [255]]  # the smallest scale; the NaN scale
    out = q.dequantize()
    assert torch.equal(out[0], torch.zeros(32)) and torch.isnan(out[1]).all()


def test_presets_and_labels():
    quest = QuantSpec.preset("mxfp4-quest")
    assert (quest.scale, quest.block, quest.scale_rule) == ("e8m0", 32, "std")
    assert quest.rms_clip == CLIP and quest.fitted_scale
    assert quest.short() == "e2m1/e8m0/32/std/rne/clip2.92248"
    row = QuantSpec.preset("fp4-row-rms")
    assert (row.scale, row.block, row.scale_rule) == ("fp32", "row", "rms")
    assert not QuantSpec().fitted_scale
    # left out of resolved recipes at its default, so theirs stay as they were
    assert "rms_clip" not in _asdict(QuantSpec()) and _asdict(quest)["rms_clip"] == CLIP


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rms_clip": CLIP}, "rms_clip: only applies with scale_rule rms or std"),
        ({"scale_rule": "rms"}, r"rms_clip: scale_rule rms needs .* \(got 0.0\)"),
        ({"scale_rule": "std", "rms_clip": 65.0}, r"in \(0, 64\]"),
        ({"scale_rule": "std", "rms_clip": True}, "rms_clip: must be a number"),
        (
            {"scale": "ue4m3", "tensor_scale": True, "scale_rule": "std", "rms_clip": CLIP},
            "scale_rule: std cannot be combined with tensor_scale",
        ),
        (
            {"scale_rule": "rms", "rms_clip": CLIP, "four_over_six": True},
            "scale_rule: rms cannot be combined with four_over_six",
        ),
        ({"scale_rule": "median"}, "scale_rule: must be one of floor, ceil, rms, std"),
    ],
)
def test_bad_combinations_are_one_line_errors(fields, message):
    with pytest.raises(SpecError, match=message) as error:
        QuantSpec(**fields)
    assert "\n" not in str(error.value)


def test_recipe_error_names_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("linear:\n  forward: {x: {scale_rule: rms}}\n")
    with pytest.raises(RecipeError, match=r"bad.yaml: linear.forward.x.rms_clip: scale_rule rms"):
        load_recipe(path)


def test_kernels_refuse_the_fitted_rules():
    spec = QuantSpec.preset("mxfp4-quest")
    assert kernel_gap(spec, torch.float32) == (
        "scale_rule 'std' (kernels: floor, ceil; the reference fits it)"
    )
    assert scale_rule_gap(QuantSpec.preset("fp4-row-rms")).startswith("scale_rule 'rms'")
    assert kernel_gap(QuantSpec(), torch.float32) is None
    # backend "auto" runs the reference for it on any device
    x = torch.randn(4, 64)
    assert torch.equal(fake_quantize(x, spec), fake_quantize(x, spec, backend="torch"))
    with pytest.raises(SpecError, match="backend 'triton' does not cover scale_rule 'std'"):
        quantize(x, spec, backend="triton")
