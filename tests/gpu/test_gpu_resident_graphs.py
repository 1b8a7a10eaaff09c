"""The layers' forward programs replayed from resident graphs (`graphs("resident")`,
fp4cli/replay/resident.py) against the same programs launched step by step, bit for bit, under
BF16 autocast at GPT-2 small's MLP shape: in a loop whose input sits at one address, or at two
in turn (x is copied into the graph's buffer: one graph either way), with a result held into
the next call (never overwritten), and a program that returns x itself (refused)."""

import pytest
import torch

from fp4cli import QuantLinear
from fp4cli.linear import LinearConfig
from fp4cli.linear.plans import PROGRAMS
from fp4cli.quant import QuantSpec
from fp4cli.replay import graphs
from tests.gpu.test_gpu_replay import layer

pytestmark = pytest.mark.gpu

RECIPES = ["mxfp4", "tetrajet", "tetrajet-qema", "tseng-rht-sr", "nvfp4", "nvidia-nvfp4"]


def training_steps(quantized, count, buffers, hold=False):
    """`count` forward and backward passes, the input refilled in `buffers` in turn (so it sits
    at their addresses, as a loop's activations do). Returns copies of (y, dx, dW, db) and the
    outputs held (`hold`: each step's y kept, as a caller's variable would)."""
    results, held = [], []
    for index in range(count):
        generator = torch.Generator(device="cuda").manual_seed(index)
        buffer = buffers[index % len(buffers)]
        buffer.copy_(torch.randn(buffer.shape, device="cuda", generator=generator))
        x = buffer.detach().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = quantized(x)
        quantized.zero_grad(set_to_none=True)
        y.backward(torch.randn(y.shape, device="cuda", generator=generator).to(y.dtype))
        quantized.update_ema()
        grads = (quantized.weight.grad, quantized.bias.grad)
        results.append(tuple(t.clone() for t in (y.detach(), x.grad, *grads)))
        if hold:
            held.append(y)
        del y, x, grads
    return results, held


def input_buffers(count):
    return [torch.empty(4096, 768, device="cuda", dtype=torch.bfloat16) for _ in range(count)]


def assert_same(got, expected):
    for got_step, expected_step in zip(got, expected, strict=True):
        for a, b in zip(got_step, expected_step, strict=True):
            assert torch.equal(a, b)


def replays(graphs_held):
    return sum(graph.replays for graph in graphs_held)


@pytest.mark.parametrize("buffers", [1, 2])
@pytest.mark.parametrize("name", RECIPES)
def test_resident_graphs_give_the_programs_bits(name, buffers):
    PROGRAMS.clear()
    resident_layer = layer(name)
    with graphs("resident"):
        got, _ = training_steps(resident_layer, 8, input_buffers(buffers))
    assert len(PROGRAMS.residents()) == 1 and not PROGRAMS.resident_refusals()
    # a direct call, a recorded call, a replay, then the graph (its first call checked)
    assert replays(PROGRAMS.residents()) == 5
    PROGRAMS.clear()
    launched_layer = layer(name)
    with graphs("off"):
        expected, _ = training_steps(launched_layer, 8, input_buffers(buffers))
    assert not PROGRAMS.residents()
    assert_same(got, expected)
    assert int(resident_layer.calls) == int(launched_layer.calls) == 8


def test_a_held_result_is_never_overwritten():
    PROGRAMS.clear()
    resident_layer = layer("tetrajet")
    with graphs("resident"):
        got, held = training_steps(resident_layer, 8, input_buffers(1), hold=True)
        assert len(PROGRAMS.residents()) == 1
        (graph,) = PROGRAMS.residents()
        assert graph.replays == 1  # its checked call; every later one found its y held
        for kept, step in zip(held, got, strict=True):
            assert torch.equal(kept.detach(), step[0])
    PROGRAMS.clear()
    with graphs("off"):
        expected, _ = training_steps(layer("tetrajet"), 8, input_buffers(1))
    assert_same(got, expected)


def test_a_program_that_returns_x_is_refused_and_replays_its_steps():
    mxfp4 = QuantSpec.preset("mxfp4")
    config = LinearConfig(forward_x=mxfp4, forward_w=mxfp4)  # x kept as given for dW

    def bf16_layer():
        torch.manual_seed(0)
        return QuantLinear(768, 3072, config=config, seed=1).cuda()

    PROGRAMS.clear()
    with graphs("resident"):
        got, _ = training_steps(bf16_layer(), 6, input_buffers(1))
    assert not PROGRAMS.residents()
    assert PROGRAMS.resident_refusals() == ["its result holds an input copied into a shared buffer"]
    PROGRAMS.clear()
    with graphs("off"):
        expected, _ = training_steps(bf16_layer(), 6, input_buffers(1))
    assert_same(got, expected)
