"""On a CUDA GPU: the reference gives the same bits as on the CPU, and the layer trains in bf16."""

import pytest
import torch
import torch.nn as nn

import fp4cli
from fp4cli import QuantSpec, fake_quantize, quantize

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SPECS = [
    QuantSpec.preset("mxfp4"),
    QuantSpec.preset("mxfp4-ceil", rounding="sr"),
    QuantSpec.preset("mxfp4", rounding="sr", sr_prescale=0.75),
    QuantSpec.preset("nvfp4"),
    QuantSpec.preset("nvfp4-2d"),
    QuantSpec.preset("nvfp4-4over6"),  # the candidates' integer errors: no order to differ in
    QuantSpec.preset("nvfp4-2d", four_over_six=True),
    QuantSpec.preset("nvfp4-4over6", four_over_six_metric="mae"),
    QuantSpec.preset("nvfp4-4over6", rounding="sr", sr_prescale=16 / 17),
    QuantSpec.preset("fp4-column", scale_bf16=True),
    QuantSpec.preset("mxfp4-ue5m3", rounding="sr"),
    QuantSpec.preset("fp8-e4m3"),
]


def _adversarial(shape, generator):
    x = torch.randn(shape, generator=generator) * torch.exp2(
        torch.randint(-40, 40, (shape[0], 1), generator=generator).float()
    )
    x[0, :64] = 0.0  # all-zero blocks
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    x[3, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0] * 4)  # ties
    x[4, :8] = 1e-40  # subnormals
    return x


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.short())
@pytest.mark.parametrize("axis", [-1, 0])
def test_reference_is_device_independent_bf16(spec, axis):
    generator = torch.Generator().manual_seed(0)
    x = _adversarial((1024, 1000), generator).to(torch.bfloat16)
    cpu = quantize(x, spec, axis=axis, seed=42)
    gpu = quantize(x.cuda(), spec, axis=axis, seed=42)
    assert torch.equal(cpu.codes, gpu.codes.cpu())
    _assert_same_bits(cpu.scales, gpu.scales.cpu())  # floats (with NaN) for fp32 scales
    a = fake_quantize(x, spec, axis=axis, seed=42)
    b = fake_quantize(x.cuda(), spec, axis=axis, seed=42).cpu()
    _assert_same_bits(a, b)


def _assert_same_bits(a, b):
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("recipe", ["tetrajet", "nvfp4", "tseng-rht-sr", "wang-fp4"])
def test_layer_trains_under_bf16_autocast(recipe):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).cuda()
    fp4cli.quantize_model(model, recipe, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    teacher = torch.randn(256, 256, device="cuda") / 16
    losses = []
    for _ in range(30):
        x = torch.randn(512, 256, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), torch.tanh(x @ teacher))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(lambda v: v == v and v < float("inf"), losses))
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])


def test_compiled_model_matches_eager():
    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)).cuda()
        return fp4cli.quantize_model(model, "tetrajet", seed=0)

    eager, compiled_model = build(), build()
    compiled = torch.compile(compiled_model)
    for _ in range(2):  # the second step must reuse the graph with fresh random bits
        x = torch.randn(64, 128, device="cuda")
        y_eager, y_compiled = eager(x), compiled(x)
        torch.testing.assert_close(y_compiled, y_eager, rtol=1e-5, atol=1e-5)
        y_eager.square().sum().backward()
        y_compiled.square().sum().backward()
    torch.testing.assert_close(
        compiled_model[0].weight.grad, eager[0].weight.grad, rtol=1e-4, atol=1e-4
    )


def test_fixed_sign_transforms_capture_in_a_cuda_graph():
    """The reference executor's fixed-sign transforms (nvfp4's TransformerEngine signs) make no
    host-to-device copy, which a CUDA graph's capture refuses: `fp4 bench step --backends torch
    --modes graph` captures them."""
    from fp4cli.techniques.hadamard import TE_SIGNS_16, FixedSigns, rht

    x = torch.randn(64, 48, device="cuda")
    signs = FixedSigns.of(TE_SIGNS_16)
    expected = rht(x, 0, 16, signs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rht(x, 0, 16, signs)
    graph.replay()
    assert torch.equal(captured, expected)
    assert torch.equal(signs.vector(16).cpu(), torch.tensor(TE_SIGNS_16, dtype=torch.float32))
