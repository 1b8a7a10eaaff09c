"""torch.compile's modes on a GPU: the quantized layer (its custom ops) compiled by Inductor, with
and without autotuning, and replayed from CUDA graphs ("reduce-overhead"), gives the eager
layer's outputs and gradients bit for bit over calls that replay the layer programs."""

import pytest
import torch

from fp4cli import QuantLinear
from fp4cli.recipes import load_recipe

pytestmark = pytest.mark.gpu

MODES = ["default", "max-autotune-no-cudagraphs", "reduce-overhead"]


def passes(layer, calls=4):
    results = []
    for index in range(calls):
        generator = torch.Generator(device="cuda").manual_seed(index)
        x = torch.randn(2048, 768, device="cuda", generator=generator).requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)
        y.backward(torch.randn(y.shape, device="cuda", generator=generator).to(y.dtype))
        results.append((y.detach().clone(), x.grad.clone(), layer.weight.grad.clone()))
        layer.zero_grad()
    return results


def layer(name):
    torch.manual_seed(0)
    return QuantLinear(768, 3072, config=load_recipe(name).linear, seed=1).cuda()


CASES = [("mxfp4", mode) for mode in MODES] + [
    ("tetrajet", "reduce-overhead"),
    ("wang-fp4", "default"),
]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_each_compile_mode_gives_the_eager_bits(name, mode):
    eager = passes(layer(name))
    torch._dynamo.reset()
    compiled = torch.compile(layer(name), mode=mode, fullgraph=True)
    for got, expected in zip(passes(compiled), eager, strict=True):
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


def test_explain_finds_no_break_in_a_quantized_gpt():
    import fp4cli
    from fp4cli.tasks.gpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 64, 2, 128, 4)).cuda()
    fp4cli.quantize_model(model, "tetrajet", seed=0)
    inputs = torch.randint(0, 256, (2, 64), device="cuda")
    torch._dynamo.reset()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        explanation = torch._dynamo.explain(model)(inputs)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
