"""The layer programs replayed from CUDA graphs (`fp4cli.replay.graphed`) against the same
programs launched step by step, bit for bit, under BF16 autocast at GPT-2 small's MLP shape;
each call's tensors its own, the layer's count of calls written back; a graph never launched
inside another capture."""

import pytest
import torch

from fp4cli.linear.plans import PROGRAMS
from fp4cli.replay import graphs
from tests.gpu.test_gpu_replay import layer, passes

pytestmark = pytest.mark.gpu

RECIPES = [
    "mxfp4",
    "tetrajet",
    "tetrajet-qema",
    "tseng-rht-sr",
    "nvfp4",
    "nvidia-nvfp4",
    "wang-fp4",
]


@pytest.mark.parametrize("name", RECIPES)
def test_graphed_programs_give_the_programs_bits(name):
    shapes = [4096] * 6 + [1000] * 6
    PROGRAMS.clear()
    graphed_layer = layer(name)
    with graphs("always"):
        graphed = passes(graphed_layer, shapes)
    assert len(PROGRAMS.graphs()) >= 2 and not PROGRAMS.graph_refusals()
    assert int(graphed_layer.calls) == len(shapes)  # the graphs count each call in the layer
    PROGRAMS.clear()
    with graphs("off"):
        launched = passes(layer(name), shapes)
    assert not PROGRAMS.graphs()
    for got, expected in zip(graphed, launched, strict=True):
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


def test_each_graphed_call_returns_tensors_of_its_own():
    PROGRAMS.clear()
    quantized = layer("mxfp4")
    with graphs("always"):
        first = passes(quantized, [4096] * 5)
        kept = [t.clone() for t in first[-1]]
        passes(quantized, [4096])
    assert len(PROGRAMS.graphs()) == 2
    for a, b in zip(first[-1], kept, strict=True):
        assert torch.equal(a, b)


def test_auto_replays_the_graph_only_while_the_device_waits(monkeypatch):
    from fp4cli.replay.graphed import GraphedProgram

    PROGRAMS.clear()
    quantized = layer("mxfp4")
    x = torch.randn(4096, 768, device="cuda").to(torch.bfloat16)

    def forward():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            return quantized(x)

    with graphs("always"):
        for _ in range(5):
            forward()
    assert len(PROGRAMS.graphs()) == 1
    graphed = []
    call = GraphedProgram.__call__
    monkeypatch.setattr(GraphedProgram, "__call__", lambda *a: graphed.append(1) or call(*a))
    with graphs("auto"):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # the device busy for tens of milliseconds
        forward()  # the previous call had ended: from the graph
        forward()  # the previous call waits behind the sleep: launched step by step
        assert len(graphed) == 1
        torch.cuda.synchronize()
        forward()
        assert len(graphed) == 2


def test_a_capture_launches_the_program_not_its_graph():
    PROGRAMS.clear()
    quantized = layer("mxfp4")
    x = torch.randn(4096, 768, device="cuda").to(torch.bfloat16)
    with graphs("always"), torch.no_grad():
        for _ in range(5):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                eager = quantized(x)
        assert len(PROGRAMS.graphs()) == 1
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        outer = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            outer.capture_begin()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                captured = quantized(x)
            outer.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        outer.replay()
        torch.cuda.synchronize()
    assert torch.equal(captured, eager)
