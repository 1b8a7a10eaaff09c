"""Four-over-six block scaling: each block keeps the candidate (amax scaled to 6 or to 4) whose
decoded values are nearer; worked by hand on NVFP4 with the tensor amax at 256 * 6 = 1536, where
the global scales are 1 (the oracle in tests/oracle.py checks every scale format and input)."""

import pytest
import torch

import fp4cli
from fp4cli.linear.fast import fast_gap
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.two_level import scale_max
from fp4cli.recipes import load_recipe

FOUR_OVER_SIX = QuantSpec.preset("nvfp4-4over6")


def test_each_block_keeps_the_nearer_candidate():
    x = torch.zeros(1, 48)
    x[0, 0] = 1536.0  # the tensor amax: G = 256 * 6 / 1536 = 1
    x[0, 16], x[0, 17] = 5.0, 4.0  # to 6: scale E4M3(5/6) = 0.8125, 5 -> 4.875, 4 -> 3.25;
    #                                to 4: scale 1.25, 5 -> 5, 4 -> 3.75: nearer
    x[0, 32], x[0, 33] = 6.0, 1.0  # to 6: scale 1, exact; to 4: scale 1.5, 1 -> 0.75
    qt = quantize(x, FOUR_OVER_SIX)
    assert qt.scale_values().tolist() == [[256.0, 1.25, 1.0]]  # block 0: a tie keeps 6
    out = qt.dequantize()
    assert out[0, 16].item() == pytest.approx(5.0, rel=1e-6)
    assert out[0, 17].item() == pytest.approx(3.75, rel=1e-6)
    assert out[0, 33].item() == pytest.approx(1.0, rel=1e-6)
    plain = fake_quantize(x, FOUR_OVER_SIX.replace(four_over_six=False))
    assert (out - x).square().sum() < (plain - x).square().sum()


def test_the_tensor_scale_leaves_room_for_four():
    assert scale_max(FOUR_OVER_SIX) == 256.0  # the largest power of two <= 448 / 1.5
    assert scale_max(QuantSpec.preset("nvfp4")) == 448.0
    assert scale_max(QuantSpec.preset("mxfp4-ue5m3", four_over_six=True)) == 32768.0


def test_options_and_where_it_runs():
    with pytest.raises(SpecError, match="four_over_six: only with e2m1"):
        QuantSpec(element="int4", four_over_six=True)
    with pytest.raises(SpecError, match="four_over_six: must be true or false"):
        QuantSpec(four_over_six="yes")
    assert FOUR_OVER_SIX.short().endswith("/4over6")
    recipe = load_recipe("nvfp4-4over6")
    assert fast_gap(recipe.linear) is None
    assert recipe.linear.spec("forward_w").four_over_six and recipe.linear.spec("forward_w").tile2d
    assert not recipe.linear.spec("grad_input_dy").four_over_six
    # a resolved recipe without the option keeps its form (no four_over_six key)
    assert "four_over_six" not in str(load_recipe("nvfp4").to_dict())


def test_the_recipe_trains_a_layer():
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    fp4cli.quantize_model(model, "nvfp4-4over6", seed=0, skip=())
    x = torch.randn(8, 32, requires_grad=True)
    model(x).square().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(model[0].weight.grad).all()
