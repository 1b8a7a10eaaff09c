"""The layer programs replayed on a GPU (compiled kernels launched from the recorded call,
Triton's launcher called directly where its layout is known) against the executors' direct
calls, bit for bit, under BF16 autocast at GPT-2 small's MLP shape."""

import pytest
import torch

from fp4cli import QuantLinear
from fp4cli.linear.plans import PROGRAMS
from fp4cli.recipes import load_recipe
from fp4cli.replay import replays

pytestmark = pytest.mark.gpu

RECIPES = ["mxfp4", "tetrajet-qema", "tseng-rht-sr", "nvfp4", "nvidia-nvfp4", "wang-fp4"]


def passes(layer, shapes):
    results = []
    for index, rows in enumerate(shapes):
        generator = torch.Generator(device="cuda").manual_seed(index)
        x = torch.randn(rows, layer.in_features, device="cuda", generator=generator)
        x = x.to(torch.bfloat16).requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)
        layer.zero_grad()
        y.backward(torch.randn(y.shape, device="cuda", generator=generator).to(y.dtype))
        layer.update_ema()
        results.append((y.detach(), x.grad, layer.weight.grad, layer.bias.grad))
    return results


def layer(name):
    torch.manual_seed(0)
    return QuantLinear(768, 3072, config=load_recipe(name).linear, seed=1).cuda()


@pytest.mark.parametrize("name", RECIPES)
def test_replays_match_direct_calls_on_the_gpu(name):
    shapes = [4096, 4096, 4096, 4096, 1000, 1000, 1000]
    replayed = passes(layer(name), shapes)
    assert len(PROGRAMS.programs()) == 4 and not PROGRAMS.refusals()
    with replays(False):
        direct = passes(layer(name), shapes)
    for got, expected in zip(replayed, direct, strict=True):
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)
