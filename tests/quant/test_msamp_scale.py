"""MS-AMP's power-of-two FP4 scale (`QuantSpec.scale_bf16`): 2^-floor(log2(6 / amax)) with
1 / amax, its product with 6 and the logarithm each rounded to bfloat16, as MS-AMP's
`compute_scaling_factor` runs on a bfloat16 amax. Worked through by hand, then against the
code's steps in torch's bfloat16 arithmetic for every bfloat16 amax in the rule's range."""

from __future__ import annotations

import pytest
import torch

from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.scales import BF16_SCALE_RANGE, bf16_scale_exponent, pow2_scale_exponent

ROW = QuantSpec.preset("fp4-row", scale_bf16=True)
EXACT_ROW = QuantSpec.preset("fp4-row")


def _code_steps(amax: torch.Tensor) -> torch.Tensor:
    """The scale exponent as MS-AMP's steps compute it on a bfloat16 tensor (each operation in
    float32, rounded to bfloat16): -floor(log2(reciprocal(amax) * 6))."""
    a = amax.to(torch.bfloat16)
    sf_exponent = torch.floor(torch.log2(torch.reciprocal(a) * 6.0))
    return -sf_exponent.to(torch.int64)


def _bf16_values(low: float, high: float) -> torch.Tensor:
    every = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    every = every.to(torch.float32)
    return every[(every >= low) & (every <= high)]


def test_one_amax_by_hand():
    """amax 0.0947265625 (a bfloat16): 1 / a = 10.5567 -> 10.5625; * 6 = 63.375, a tie of
    63.25 and 63.5 -> 63.5 (the even significand); log2(63.5) = 5.98868 -> 6.0 (bfloat16's
    spacing in [4, 8) is 1/32: 5.96875 or 6.0, nearer 6.0): sf 2^6, scale 2^-6. The exact rule:
    ceil(log2(a / 6)) = ceil(-5.985) = -5, scale 2^-5. At scale 2^-6 a maps to 6.0625 and
    saturates to 6: it decodes to 0.09375."""
    amax = torch.tensor([0.0947265625])
    assert bf16_scale_exponent(amax).tolist() == [-6]
    assert pow2_scale_exponent(amax, EXACT_ROW).tolist() == [-5]
    x = torch.tensor([[0.0947265625, -0.03, 0.0]])
    assert quantize(x, ROW).scale_values().tolist() == [[2.0**-6]]
    assert quantize(x, EXACT_ROW).scale_values().tolist() == [[2.0**-5]]
    assert fake_quantize(x, ROW)[0, 0].item() == 6 * 2.0**-6
    assert fake_quantize(x, EXACT_ROW)[0, 0].item() == 3 * 2.0**-5  # 3.03 -> 3 at 2^-5


def test_every_bfloat16_amax_in_range_is_the_codes():
    """All 25,600 bfloat16 values in [2^-100, 2^100]: the rule is the code's steps, and the
    exact rule's exponent or one lower (never higher)."""
    amax = _bf16_values(*BF16_SCALE_RANGE)
    assert amax.numel() == 200 * 128 + 1
    ours = bf16_scale_exponent(amax)
    assert torch.equal(ours, _code_steps(amax))
    exact = pow2_scale_exponent(amax, EXACT_ROW)
    lower = exact - ours
    assert set(lower.unique().tolist()) == {0, 1}
    assert 0.1 < lower.float().mean().item() < 0.2  # in these binades, 15.6% (docs/methods.md)


def test_no_amax_between_1_5_and_24_is_lowered():
    """r = 6 / a in [1/4, 4): log2 r in [-2, 2), where bfloat16 is fine enough that it never
    rounds up to the next integer."""
    amax = _bf16_values(1.5 + 2**-6, 24.0)
    assert torch.equal(bf16_scale_exponent(amax), pow2_scale_exponent(amax, EXACT_ROW))


def test_a_float32_amax_is_rounded_to_bfloat16_first():
    generator = torch.Generator().manual_seed(0)
    amax = torch.exp2(torch.rand(100_000, generator=generator) * 60 - 30)
    assert torch.equal(bf16_scale_exponent(amax), _code_steps(amax))


def test_outside_its_range_the_exact_rule():
    spec = QuantSpec.preset("fp4-column", scale_bf16=True)
    amax = torch.tensor([2.0**-110, 2.0**110, 0.0, 0.0947265625])
    got = pow2_scale_exponent(amax, spec)
    exact = pow2_scale_exponent(amax, QuantSpec.preset("fp4-column"))
    assert got[:3].tolist() == exact[:3].tolist()
    assert got[3].item() == exact[3].item() - 1


def test_the_option_is_for_msamps_vector_wise_fp4():
    assert (
        QuantSpec(block="tensor", scale_rule="ceil", scale_bf16=True).short().endswith("bf16scale")
    )
    with pytest.raises(SpecError, match="scale_bf16: MS-AMP's scale is for e2m1"):
        QuantSpec.preset("mxfp4-ceil", scale_bf16=True)
    with pytest.raises(SpecError, match="scale_bf16: MS-AMP's scale is for e2m1"):
        QuantSpec.preset("fp8-e4m3-tensor", scale_bf16=True)
    with pytest.raises(SpecError, match="scale_bf16: needs scale_rule ceil"):
        QuantSpec(block="row", scale_bf16=True)
    with pytest.raises(SpecError, match="scale_bf16: must be true or false"):
        QuantSpec.preset("fp4-row", scale_bf16=1)


def test_the_wang_recipes_take_the_exact_rule_and_the_codes_one_option_away():
    from fp4cli.recipe_schema import Recipe
    from fp4cli.recipes import apply_overrides, load_recipe

    for name in ("wang-fp4", "wang-direct"):
        linear = load_recipe(name).linear
        assert not linear.forward_x.scale_bf16 and not linear.forward_w.scale_bf16
        assert "scale_bf16" not in load_recipe(name).to_dict()["linear"]["forward"]["x"]
    keys = ["linear.forward.x.scale_bf16=true", "linear.forward.w.scale_bf16=true"]
    recipe = apply_overrides(load_recipe("wang-fp4"), keys)
    assert recipe.linear.forward_x.scale_bf16 and recipe.linear.forward_w.scale_bf16
    assert recipe.linear.forward_w.block == "column"
    assert Recipe.from_dict(recipe.to_dict()) == recipe
