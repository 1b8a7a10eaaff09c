"""The methods as their released code computes them, and the newer methods' options, pinned to
values worked by hand: Wang et al.'s weight scale axis, gradients, clamping, compensation and
DGE; the UE5M3 scale that never clips for SR; the deterministic Hadamard; E1M2 elements."""

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.formats import E1M2, E2M1, magnitude_grid, round_to_grid
from fp4cli.linear import LinearConfig, QuantLinear
from fp4cli.linear.fast import fast_gap
from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.recipes import list_recipes, load_recipe
from fp4cli.techniques import DGEConfig, HadamardConfig, OutlierConfig, QEMAConfig
from fp4cli.techniques.dge import dge_derivative
from fp4cli.techniques.hadamard import hadamard_matrix, rht
from fp4cli.techniques.outliers import clamp_outliers

COLUMN, ROW = QuantSpec.preset("fp4-column"), QuantSpec.preset("fp4-row")
W = torch.tensor([[1.0, 12.0, 0.3, -7.0], [2.0, -1.0, 0.2, 3.0], [-0.5, 3.0, 0.1, 1.0]])


def test_wang_weight_scale_is_per_input_channel():
    """amax over dim 0 of the (out, in) weight: column scales 2^ceil(log2(amax / 6)) =
    (1/2, 2, 1/16, 2); then RNE onto E2M1 (-7 / 2 = -3.5, a tie, goes to the even code 4)."""
    q = quantize(W, COLUMN)
    assert q.scale_values().tolist() == [0.5, 2.0, 1 / 16, 2.0]
    expected = [[1.0, 12.0, 0.25, -8.0], [2.0, -1.0, 0.1875, 3.0], [-0.5, 3.0, 0.09375, 1.0]]
    assert fake_quantize(W, COLUMN).tolist() == expected
    # one scale per output row instead (the paper's reading): row 0's scale 2 flushes 0.3
    assert fake_quantize(W, ROW)[0].tolist() == [1.0, 12.0, 0.0, -8.0]
    # the layer's forward weight (x = I gives W_q^T)
    layer = QuantLinear(4, 3, bias=False, config=LinearConfig(forward_w=COLUMN), seed=0)
    layer.weight.data.copy_(W)
    assert layer(torch.eye(4)).T.tolist() == expected
    assert fast_gap(LinearConfig(forward_w=COLUMN)).startswith("forward_w: block 'column'")


def test_wang_gradients_are_one_e5m2_tensor_with_a_power_of_two_scale():
    """amax 1000: scale 2^ceil(log2(1000 / 57344)) = 2^-5; 1000 * 32 = 32000 rounds onto E5M2's
    grid (spacing 4096 in [16384, 32768)) to 32768, i.e. 1024. Blocked along either axis, the
    one per-tensor scale gives the same tensor to both backward GEMMs."""
    spec = QuantSpec.preset("fp8-e5m2-tensor")
    dy = torch.randn(16, 8)
    dy[3, 5] = 1000.0
    assert quantize(dy, spec).scale_values().tolist() == [2.0**-5]
    along_out, along_tokens = fake_quantize(dy, spec, axis=1), fake_quantize(dy, spec, axis=0)
    assert along_out[3, 5] == 1024.0 and torch.equal(along_out, along_tokens)
    wang = load_recipe("wang-fp4").linear
    assert wang.grad_input_dy == wang.grad_weight_dy == spec


def test_clamp_quantile_is_the_nearest_rank_per_token():
    """Ranks int((1 - q) n) and int(q n) of the sorted token: q = 0.75, n = 8 -> ranks 2 and 6,
    so 0..7 clamps to [2, 6]; at q = 0.99 a token of 64 values (ranks 0 and 63) is untouched."""
    x = torch.tensor([[7.0, 0.0, 5.0, 1.0, 6.0, 2.0, 4.0, 3.0]])
    clamped, residual = clamp_outliers(x, OutlierConfig(0.75))
    assert clamped.tolist() == [[6.0, 2.0, 5.0, 2.0, 6.0, 2.0, 4.0, 3.0]]
    assert residual.tolist() == [[1.0, -2.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0]]
    wide = torch.randn(3, 64)
    assert torch.equal(clamp_outliers(wide, OutlierConfig(0.99))[0], wide)
    linear = clamp_outliers(x, OutlierConfig(0.75, method="linear"))[0]  # ranks 1.75, 5.25
    assert linear.tolist() == [[5.25, 1.75, 5.0, 1.75, 5.25, 2.0, 4.0, 3.0]]


def test_compensated_forward_and_weight_gradient():
    """The residual X - clamp(X) is added to Q(clamp(X)) before the GEMMs: forward
    y = (Q(clamp X) + r) Q(W)^T + b, and (double quantization) dW = dY^T E4M3(Q(clamp X) + r)."""
    outliers = OutlierConfig(0.75, compensate=True)
    x_spec, w_spec = ROW, COLUMN
    e4m3 = QuantSpec.preset("fp8-e4m3-tensor")
    config = LinearConfig(forward_x=x_spec, forward_w=w_spec, grad_weight_x=e4m3,
                          double_quant=True, outliers=outliers)  # fmt: skip
    layer = QuantLinear(8, 3, config=config, seed=0)
    layer.weight.data.copy_(torch.cat([W, W], dim=1) / 4)
    x = torch.tensor([[0.1, -0.2, 0.3, 5.0, -0.4, 0.2, 0.0, -3.0],
                      [1.0, 2.0, -1.5, 0.5, 0.25, -0.75, 9.0, 0.0]])  # fmt: skip
    dy = torch.tensor([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]])
    y = layer(x)
    y.backward(dy)

    low = x.sort(dim=1).values[:, 2:3]  # ranks int(0.25 * 8) = 2 and int(0.75 * 8) = 6
    high = x.sort(dim=1).values[:, 6:7]
    clamped = torch.minimum(torch.maximum(x, low), high)
    operand = fake_quantize(clamped, x_spec) + (x - clamped)
    w_q = fake_quantize(layer.weight.detach(), w_spec)
    torch.testing.assert_close(y, operand @ w_q.T + layer.bias, rtol=0, atol=1e-6)
    expected_dw = dy.T @ fake_quantize(operand, e4m3, axis=0)
    torch.testing.assert_close(layer.weight.grad, expected_dw, rtol=0, atol=1e-6)
    # the former reading (residual through the unquantized W, left out of dW) differs
    former = fake_quantize(clamped, x_spec) @ w_q.T + (x - clamped) @ layer.weight.T
    assert not torch.allclose(y - layer.bias, former, atol=1e-3)
    with pytest.raises(ValueError, match="forward Hadamard"):
        LinearConfig(forward_x=x_spec, outliers=outliers, forward_hadamard=HadamardConfig(16))


@pytest.mark.parametrize("k", [5.0, 3.0])
def test_dge_at_the_grids_top_takes_the_last_intervals_value(k):
    """At |x| = 6 the last interval [4, 6] gives |2 (6 - 4) / 2 - 1|^(1/k - 1) / k = 1/k (0.2
    for k = 5), as Wang et al.'s kernel; beyond the grid (a clipped weight) 0."""
    x = torch.tensor([-6.0, 6.0, 5.5, -4.0, 7.0])
    got = dge_derivative(x, E2M1, DGEConfig(k=k)).tolist()
    assert got[0] == pytest.approx(1 / k) and got[1] == pytest.approx(1 / k)
    assert got[2] == pytest.approx(0.5 ** (1 / k - 1) / k)  # t = |2 (5.5 - 4) / 2 - 1| = 0.5
    assert got[3] == pytest.approx(1 / k) and got[4] == 0.0


def test_ue5m3_sr_with_the_scale_rounded_up_never_clips_and_is_unbiased():
    """Rounding amax / 6 to the nearest UE5M3 value puts about half the blocks' maxima past the
    grid: SR saturates them (a bias of about -1% there). Rounded up, none is."""
    torch.manual_seed(0)
    x = torch.randn(256, 16 * 32)
    blocks = x.reshape(256, 16, 32)
    top = blocks.abs().argmax(-1, keepdim=True)
    maxima = blocks.gather(-1, top)
    bias = {}
    for rule in ("floor", "ceil"):
        spec = QuantSpec.preset("mxfp4-ue5m3", rounding="sr", scale_rule=rule)
        units = quantize(x, spec, seed=0).grid_units(x).abs().reshape(256, 16, 32).amax(-1)
        clipped = (units > 6).float().mean().item()
        assert (clipped > 0.4) if rule == "floor" else (clipped == 0.0)
        mean = sum(fake_quantize(x, spec, seed=s).reshape(256, 16, 32).gather(-1, top)
                   for s in range(16)) / 16  # fmt: skip
        bias[rule] = ((mean - maxima) / maxima).mean().item()
    assert bias["floor"] < -0.005 and abs(bias["ceil"]) < 0.0025
    recipe = load_recipe("ue5m3-hadamard-sr").linear
    assert recipe.grad_input_dy.scale_rule == "ceil" and recipe.forward_x.scale_rule == "floor"


def test_deterministic_hadamard_is_the_plain_matrix_at_every_call():
    x = torch.randn(4, 48)
    transformed = rht(x, -1, 16, None)
    by_matrix = (x.reshape(4, 3, 16) @ hadamard_matrix(16)).reshape(4, 48)
    torch.testing.assert_close(transformed, by_matrix, rtol=0, atol=1e-6)
    mx = QuantSpec.preset("mxfp4")
    x = torch.randn(16, 32)
    gradients = {}
    for random in (True, False):
        hadamard = HadamardConfig(16, random=random)
        config = LinearConfig(grad_weight_dy=mx, grad_weight_x=mx, grad_weight_hadamard=hadamard)
        layer = QuantLinear(32, 16, config=config, seed=0)
        grads = []
        for _ in range(2):  # two training calls on the same input
            layer.weight.grad = None
            layer(x).square().sum().backward()
            grads.append(layer.weight.grad.clone())
        gradients[random] = grads
    assert torch.equal(*gradients[False]) and not torch.equal(*gradients[True])
    deterministic = LinearConfig(grad_weight_hadamard=HadamardConfig(16, random=False))
    assert fast_gap(deterministic) is None  # the kernels take it as fixed signs: none
    # a resolved recipe writes `random` only when it is false (older points keep their ids)
    assert "random" not in load_recipe("tseng-rht-sr").to_dict()["linear"]["grad_input"]["hadamard"]
    dht = load_recipe("mxfp4-dht").to_dict()["linear"]["grad_weight"]["hadamard"]
    assert dht == {"size": 32, "random": False}


def test_e1m2_is_the_uniform_grid_and_quantizes_like_int4():
    assert magnitude_grid(E1M2).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert E1M2.max_value == 3.5 and E1M2.bits == 4
    x = torch.randn(8, 64) * torch.logspace(-2, 2, 64)
    for extra in ({}, {"scale": "ue5m3"}, {"scale": "ue4m3", "block": 16, "tensor_scale": True},
                  {"scale_rule": "ceil"}):  # fmt: skip
        e1m2 = fake_quantize(x, QuantSpec(element="e1m2", **extra))
        assert torch.equal(e1m2, fake_quantize(x, QuantSpec(element="int4", **extra)))
    # RNE on the grid: 0.25 -> 0 and 1.25 -> 1 (even codes), 3.25 -> 3, 3.75 saturates
    values = torch.tensor([0.25, 0.75, 1.25, 3.25, 3.75, -1.25])
    assert round_to_grid(values, E1M2).tolist() == [0.0, 1.0, 1.0, 3.0, 3.5, -1.0]


def test_e1m2_works_wherever_e2m1_does():
    """SR, the SR pre-scale, DGE, Q-EMA, a Hadamard transform and double quantization."""
    sr = QuantSpec(element="e1m2", rounding="sr", sr_prescale=0.75)
    rne = QuantSpec(element="e1m2", scale_rule="ceil")
    config = LinearConfig(forward_x=rne, forward_w=rne, grad_input_dy=sr, grad_input_w=sr,
                          grad_weight_dy=sr, grad_weight_x=sr, double_quant=True,
                          grad_weight_hadamard=HadamardConfig(32), dge=DGEConfig(),
                          qema=QEMAConfig(warmup=0))  # fmt: skip
    layer = QuantLinear(64, 32, config=config, seed=0)
    layer(torch.randn(16, 64)).square().sum().backward()
    assert torch.isfinite(layer.weight.grad).all() and layer.weight.grad.abs().sum() > 0
    assert layer.executor()[0] == "reference"


def test_recipes_list_names_every_recipes_source():
    result = CliRunner().invoke(app, ["recipes", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert result.output.count("source: ") == len(list_recipes())
    for name in list_recipes():
        assert load_recipe(name).citation in " ".join(result.output.split())


def test_new_technique_options_are_one_line_errors(tmp_path):
    path = tmp_path / "bad.yaml"
    for text, key in (
        ("linear:\n  forward: {x: mxfp4}\n  outliers: {method: median}\n", "outliers.method"),
        ("linear:\n  grad_weight: {hadamard: {size: 32, random: 1}}\n", "hadamard.random"),
        ("optimizer: {qramp: {max_period: 0}}\n", "qramp.max_period"),
        ("linear:\n  forward: {x: {block: columns}}\n", "forward.x.block"),
    ):
        path.write_text(text)
        result = CliRunner().invoke(app, ["recipes", "show", str(path)])
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert key in result.output
