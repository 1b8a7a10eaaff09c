"""Q-EMA's starting point (`QEMAConfig.start`): the paper's "weight" (the first update copies W)
and TetraJet's code's "layer_init" (an average drawn from nn.Linear's default initialization,
independent of W, every update blending)."""

from __future__ import annotations

import math

import pytest
import torch

from fp4cli import LinearConfig, QuantLinear, QuantSpec, SpecError
from fp4cli.recipe_schema import Recipe
from fp4cli.recipes import apply_overrides, load_recipe
from fp4cli.techniques import QEMAConfig
from fp4cli.techniques.qema import layer_init_average

SPEC = QuantSpec.preset("mxfp4-ceil")


def _layer(start: str, seed: int = 7, beta: float = 0.5) -> QuantLinear:
    config = LinearConfig(forward_w=SPEC, qema=QEMAConfig(beta=beta, warmup=2, start=start))
    torch.manual_seed(0)  # the same W for every layer built here
    return QuantLinear(64, 8, config=config, seed=seed)


def test_the_layer_init_draw_is_nn_linears_initialization():
    """kaiming_uniform_ with a = sqrt(5): gain sqrt(2 / 6), bound gain * sqrt(3 / 64) = 1/8; the
    same numbers as nn.Linear(64, 8) built after torch.manual_seed(s) draws (reset_parameters
    draws the weight first), from a generator of its own."""
    average = layer_init_average(8, 64, 123)
    assert average.dtype == torch.float32 and average.shape == (8, 64)
    assert average.abs().max().item() <= 1 / math.sqrt(64)
    assert average.abs().max().item() > 0.9 / math.sqrt(64)  # spread over the whole range
    torch.manual_seed(123)
    assert torch.equal(average, torch.nn.Linear(64, 8).weight.detach())
    assert torch.equal(average, layer_init_average(8, 64, 123))
    assert not torch.equal(average, layer_init_average(8, 64, 124))


def test_the_average_starts_from_the_weight_or_the_layer_init_draw():
    by_weight, by_init = _layer("weight"), _layer("layer_init")
    assert torch.equal(by_weight.weight, by_init.weight)
    assert torch.equal(by_weight.weight_ema, by_weight.weight.detach())
    assert torch.equal(by_init.weight_ema, layer_init_average(8, 64, 7))
    assert not torch.equal(by_init.weight_ema, _layer("layer_init", seed=8).weight_ema)


def test_the_first_update_copies_or_blends():
    """beta 0.5: start "weight" copies W at the first update, then averages; start
    "layer_init" averages from the first update: 0.5 * draw + 0.5 * W (both products exact)."""
    by_weight, by_init = _layer("weight"), _layer("layer_init")
    draw = by_init.weight_ema.clone()
    for layer in (by_weight, by_init):
        with torch.no_grad():
            layer.weight.mul_(2.0)  # an optimizer step
        layer.update_ema()
    w = by_weight.weight.detach()
    assert torch.equal(by_weight.weight_ema, w)
    assert torch.equal(by_init.weight_ema, draw * 0.5 + w * 0.5)
    for layer in (by_weight, by_init):
        layer.update_ema()
    assert torch.equal(by_weight.weight_ema, w)  # W has not moved since
    assert torch.equal(by_init.weight_ema, (draw * 0.5 + w * 0.5) * 0.5 + w * 0.5)
    assert int(by_init.ema_updates) == 2


def test_the_guide_after_warmup_is_the_blended_average():
    layer = _layer("layer_init")
    assert torch.equal(layer._weight_guide(), layer.weight.detach())  # before warm-up: W
    layer.update_ema()
    layer.update_ema()
    assert torch.equal(layer._weight_guide(), layer.weight_ema)


def test_the_average_is_saved_and_restored():
    layer = _layer("layer_init")
    layer.update_ema()
    state = layer.state_dict()
    assert torch.equal(state["weight_ema"], layer.weight_ema)
    other = _layer("layer_init", seed=99)
    other.load_state_dict(state)
    assert torch.equal(other.weight_ema, layer.weight_ema)
    assert int(other.ema_updates) == 1


def test_start_in_recipes():
    assert load_recipe("tetrajet-qema").linear.qema == QEMAConfig(beta=0.998, warmup=10)
    recipe = apply_overrides(load_recipe("tetrajet-qema"), ["linear.qema.start=layer_init"])
    assert recipe.linear.qema is not None and recipe.linear.qema.start == "layer_init"
    resolved = recipe.to_dict()
    assert resolved["linear"]["qema"]["start"] == "layer_init"
    assert Recipe.from_dict(resolved) == recipe
    default = load_recipe("tetrajet-qema").to_dict()["linear"]["qema"]
    assert "start" not in default  # left out at its default: resolved recipes keep their form


def test_bad_starts():
    with pytest.raises(SpecError, match="start: must be one of weight, layer_init"):
        QEMAConfig(start="zeros")
