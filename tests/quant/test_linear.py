"""The quantized Linear: exact high-precision path, composition of fake_quantize calls, seeds."""

import pytest
import torch
import torch.nn as nn

from fp4cli import LinearConfig, QuantLinear, QuantSpec, fake_quantize, quantize_model
from fp4cli.linear import quantized_layers
from fp4cli.linear.function import SEED_STRIDE
from fp4cli.techniques import HadamardConfig, OutlierConfig
from fp4cli.techniques.hadamard import rht

MX = QuantSpec.preset("mxfp4")
MX_CEIL = QuantSpec.preset("mxfp4-ceil")
MX_SR = MX_CEIL.replace(rounding="sr")


def _pair(config, in_features=40, out_features=24, seed=123):
    torch.manual_seed(0)
    reference = nn.Linear(in_features, out_features)
    layer = QuantLinear.from_linear(nn.Linear(in_features, out_features), config, seed=seed)
    with torch.no_grad():
        layer.weight.copy_(reference.weight)
        layer.bias.copy_(reference.bias)
    return reference, layer


def _grads(module, x, grad_y):
    x = x.detach().requires_grad_(True)
    y = module(x)
    grads = torch.autograd.grad(y, [x, module.weight, module.bias], grad_y)
    return y, grads


@pytest.mark.parametrize("config", [LinearConfig(), LinearConfig(double_quant=True)])
@pytest.mark.parametrize("shape", [(7, 40), (3, 5, 40)])
def test_high_precision_layer_equals_nn_linear_exactly(config, shape):
    reference, layer = _pair(config)
    x = torch.randn(shape)
    grad_y = torch.randn(*shape[:-1], 24)
    y_ref, g_ref = _grads(reference, x, grad_y)
    y, g = _grads(layer, x, grad_y)
    assert torch.equal(y, y_ref)
    for a, b in zip(g, g_ref, strict=True):
        assert torch.equal(a, b)


def _composition(x, weight, bias, grad_y, config, seed):
    """The layer's math written out with fake_quantize calls (the specification)."""
    fq = fake_quantize
    x_q = fq(x, config.forward_x, -1, seed=seed + 0)
    w_q = fq(weight, config.forward_w, -1, seed=seed + 1)
    y = x_q @ w_q.T + bias
    w_src = w_q if config.double_quant else weight
    x_src = x_q if config.double_quant else x
    grad_x = fq(grad_y, config.grad_input_dy, -1, seed=seed + 2) @ fq(
        w_src, config.grad_input_w, 0, seed=seed + 3
    )
    grad_w = fq(grad_y, config.grad_weight_dy, 0, seed=seed + 4).T @ fq(
        x_src, config.grad_weight_x, 0, seed=seed + 5
    )
    return y, (grad_x, grad_w, grad_y.sum(0))


@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("tokens", [64, 50])
def test_layer_equals_composition_of_fake_quantize(double_quant, tokens):
    config = LinearConfig(MX_CEIL, MX_CEIL, MX_SR, MX_SR, MX_SR, MX_SR, double_quant=double_quant)
    _, layer = _pair(config, in_features=64, out_features=48, seed=1000)
    x = torch.randn(tokens, 64)
    grad_y = torch.randn(tokens, 48)
    y, grads = _grads(layer, x, grad_y)
    y_ref, grads_ref = _composition(x, layer.weight, layer.bias, grad_y, config, seed=1000)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_hadamard_gemms_equal_composition():
    h = HadamardConfig(32)
    config = LinearConfig(
        forward_x=MX,
        forward_w=MX,
        grad_weight_dy=MX_SR,
        grad_weight_x=MX_SR,
        forward_hadamard=h,
        grad_weight_hadamard=h,
    )
    _, layer = _pair(config, in_features=64, out_features=32, seed=77)
    x, grad_y = torch.randn(40, 64), torch.randn(40, 32)
    y, (_, grad_w, _) = _grads(layer, x, grad_y)
    s = 77
    x_q = fake_quantize(rht(x, 1, 32, s + 6), MX, -1)
    w_q = fake_quantize(rht(layer.weight, 1, 32, s + 6), MX, -1)
    torch.testing.assert_close(y, x_q @ w_q.T + layer.bias, rtol=1e-5, atol=1e-5)
    dy_q = fake_quantize(rht(grad_y, 0, 32, s + 8), MX_SR, 0, seed=s + 4)
    xb_q = fake_quantize(rht(x, 0, 32, s + 8), MX_SR, 0, seed=s + 5)
    torch.testing.assert_close(grad_w, dy_q.T @ xb_q, rtol=1e-5, atol=1e-5)


def test_outlier_compensation_restores_the_clamped_part():
    outliers = OutlierConfig(0.9, compensate=True, method="linear")
    config = LinearConfig(forward_x=MX_CEIL, outliers=outliers)
    _, layer = _pair(config, in_features=64, out_features=16)
    x = torch.randn(12, 64)
    x[3, 5] = 80.0  # an outlier
    y = layer(x)
    low = torch.quantile(x, 0.1, dim=-1, keepdim=True)
    high = torch.quantile(x, 0.9, dim=-1, keepdim=True)
    clamped = x.clamp(low, high)
    expected = fake_quantize(clamped, MX_CEIL) @ layer.weight.T + layer.bias
    expected = expected + (x - clamped) @ layer.weight.T
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_training_calls_draw_fresh_bits_and_eval_does_not():
    config = LinearConfig(forward_x=MX_SR)
    _, layer = _pair(config, seed=5)
    x = torch.randn(16, 40)
    first, second = layer(x), layer(x)
    assert not torch.equal(first, second)
    assert int(layer.calls) == 2
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    expected = fake_quantize(x, MX_SR, seed=5 + 2 * SEED_STRIDE) @ layer.weight.T + layer.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_same_seed_reproduces_a_model():
    outputs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
        quantize_model(model, LinearConfig(MX_SR, MX_SR, MX_SR, MX_SR, MX_SR, MX_SR), seed=9)
        x = torch.randn(10, 32)
        model(x).square().sum().backward()
        outputs.append(model[0].weight.grad.clone())
    assert torch.equal(outputs[0], outputs[1])


def test_quantize_model_swaps_in_place_and_skips_patterns():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = nn.Module()
            self.patch_embed.proj = nn.Linear(8, 16)
            self.blocks = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
            self.head = nn.Linear(16, 4)

    net = Net()
    weight = net.blocks[0].weight
    config = LinearConfig(forward_x=MX, forward_w=MX)
    recipe = type("R", (), {"linear": config, "skip": ("head", "patch_embed.*")})()
    quantize_model(net, recipe, seed=0)
    assert sorted(quantized_layers(net)) == ["blocks.0", "blocks.2"]
    assert type(net.head) is nn.Linear and type(net.patch_embed.proj) is nn.Linear
    assert net.blocks[0].weight is weight  # parameters are shared, not copied
    assert "forward_x=e2m1/e8m0/32/floor/rne" in repr(net.blocks[0])
    assert "grad_input_dy=hp" in repr(net.blocks[0])
    quantize_model(net, recipe, seed=0)  # converting twice changes nothing
    assert sorted(quantized_layers(net)) == ["blocks.0", "blocks.2"]


def test_high_precision_config_leaves_model_untouched():
    model = nn.Sequential(nn.Linear(4, 4))
    quantize_model(model, LinearConfig())
    assert type(model[0]) is nn.Linear


def test_autocast_bf16_on_cpu():
    _, layer = _pair(LinearConfig(MX, MX, MX, MX, MX, MX))
    x = torch.randn(8, 40, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and layer.weight.grad.dtype == torch.float32
    assert torch.isfinite(layer.weight.grad).all()


def test_invalid_linear_configs_are_rejected():
    from fp4cli import SpecError
    from fp4cli.techniques import DGEConfig

    with pytest.raises(SpecError, match="dge"):
        LinearConfig(dge=DGEConfig())
    # double quantization after a forward Hadamard transform is allowed (tests/quant/test_trust.py)
    LinearConfig(forward_x=MX, double_quant=True, forward_hadamard=HadamardConfig(16))
    with pytest.raises(SpecError, match="dge: cannot be combined with a forward Hadamard"):
        LinearConfig(forward_w=MX, dge=DGEConfig(), forward_hadamard=HadamardConfig(16))
    with pytest.raises(SpecError, match="tile2d"):
        LinearConfig(forward_x=QuantSpec.preset("nvfp4-2d"))


def test_layer_records_operand_statistics_when_asked():
    config = LinearConfig(MX_CEIL, MX_CEIL, MX_SR, MX_SR, MX_SR, None)
    _, layer = _pair(config, in_features=64, out_features=32)
    x = torch.randn(16, 64, requires_grad=True)  # so that the grad_input GEMM runs
    layer(x).sum().backward()
    assert layer.stats is None  # off by default: nothing recorded
    layer.stats = {}
    layer(x).sum().backward()
    operands = {operand for operand, _ in layer.stats}
    assert operands == {"forward_x", "forward_w", "grad_input_dy", "grad_input_w", "grad_weight_dy"}
    expected = fake_quantize(x, MX_CEIL)
    rel_mse = (expected - x).square().sum() / x.square().sum()
    torch.testing.assert_close(layer.stats[("forward_x", "rel_mse")], rel_mse)
    assert layer.stats[("forward_x", "clipped")] == 0  # the ceil rule never clips
    snr = layer.stats[("forward_w", "snr_db")]
    assert 10 < snr < 30  # FP4 with block scales: roughly 15-20 dB on Gaussian data
