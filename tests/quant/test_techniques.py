"""Techniques: random Hadamard transform, DGE, Q-EMA, outlier clamping."""

import pytest
import torch
import torch.nn as nn

from fp4cli import LinearConfig, QuantLinear, QuantSpec, SpecError, attach_qema, fake_quantize
from fp4cli.formats import E2M1
from fp4cli.techniques import DGEConfig, HadamardConfig, OutlierConfig, QEMAConfig
from fp4cli.techniques.dge import dge_derivative, dge_surrogate
from fp4cli.techniques.hadamard import SIZES, hadamard_matrix, rht, rht_matrix
from fp4cli.techniques.outliers import clamp_outliers


@pytest.mark.parametrize("n", SIZES)
def test_rht_is_orthogonal(n):
    r = rht_matrix(n, seed=11).double()
    torch.testing.assert_close(r @ r.T, torch.eye(n, dtype=torch.float64), atol=1e-6, rtol=0)
    h = hadamard_matrix(n)
    assert torch.equal(h.abs(), torch.full((n, n), n**-0.5))


@pytest.mark.parametrize("size", [16, 64, 256])
def test_rht_preserves_a_gemm(size):
    a, b = torch.randn(12, 300, dtype=torch.float64), torch.randn(9, 300, dtype=torch.float64)
    a_t, b_t = rht(a, 1, size, seed=4), rht(b, 1, size, seed=4)
    assert a_t.shape[1] % size == 0  # padded to whole Hadamard blocks
    torch.testing.assert_close(a_t.double() @ b_t.double().T, a @ b.T, rtol=1e-5, atol=1e-4)
    # Along the first dimension (the grad_weight GEMM's token axis) too.
    c, d = torch.randn(70, 5), torch.randn(70, 6)
    torch.testing.assert_close(
        rht(c, 0, size, 2).T @ rht(d, 0, size, 2), c.T @ d, rtol=1e-4, atol=1e-4
    )


def test_rht_signs_are_fresh_per_seed_and_reproducible():
    x = torch.randn(4, 64)
    assert torch.equal(rht(x, 1, 64, 5), rht(x, 1, 64, 5))
    assert not torch.equal(rht(x, 1, 64, 5), rht(x, 1, 64, 6))
    assert torch.equal(rht(x, 1, 64, torch.tensor(5)), rht(x, 1, 64, 5))


def test_rht_spreads_a_block_outlier():
    x = torch.zeros(1, 64)
    x[0, 3] = 100.0
    spread = rht(x, 1, 64, seed=1)
    assert torch.allclose(spread.abs(), torch.full_like(spread, 100.0 / 8))


def test_hadamard_config_validates():
    with pytest.raises(SpecError, match="size"):
        HadamardConfig(48)


class _Surrogate(torch.autograd.Function):
    """The DGE surrogate as forward, DGE's derivative formula as backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return dge_surrogate(x, E2M1, k=5.0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * dge_derivative(x, E2M1, DGEConfig(k=5.0, cap=1e9))


def test_dge_derivative_is_the_surrogates_derivative():
    # Points inside intervals, away from their middles (where the uncapped derivative explodes)
    # and from interval ends (where the finite difference would straddle two intervals).
    lows = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0], dtype=torch.float64)
    widths = torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0], dtype=torch.float64)
    fractions = torch.tensor([0.12, 0.3, 0.7, 0.88], dtype=torch.float64)
    points = (lows[:, None] + widths[:, None] * fractions[None, :]).flatten()
    points = torch.cat([points, -points]).requires_grad_(True)
    assert torch.autograd.gradcheck(_Surrogate.apply, (points,), eps=1e-7, atol=1e-5)


def test_dge_derivative_values():
    config = DGEConfig()  # k=5, cap=3
    x = torch.tensor([0.0, 0.25, 0.5, 2.5, 5.999, 7.0])
    d = dge_derivative(x, E2M1, config)
    assert d[0] == pytest.approx(0.2)  # interval edge: 1/k
    assert d[1] == 3.0  # interval middle: capped
    assert d[3] == 3.0
    assert d[5] == 0.0  # beyond the grid (clipped)
    # Mean over an interval: the cap c holds for |t| < t_c = (k c)^(-k/(k-1)); the rest
    # integrates to 1 - t_c^(1/k). (Uncapped, the mean would be exactly 1.)
    n = 400000
    u = 2.0 + (torch.arange(n, dtype=torch.float64) + 0.5) / n
    mean = dge_derivative(u, E2M1, config).mean().item()
    t_c = (5 * 3.0) ** (-5 / 4)
    assert mean == pytest.approx(3.0 * t_c + 1 - t_c**0.2, rel=1e-3)


def test_layer_applies_dge_to_the_weight_gradient():
    spec = QuantSpec.preset("fp4-row")
    plain = LinearConfig(forward_x=spec, forward_w=spec)
    with_dge = LinearConfig(forward_x=spec, forward_w=spec, dge=DGEConfig())
    torch.manual_seed(0)
    base = nn.Linear(32, 16)
    x, grad_y = torch.randn(8, 32), torch.randn(8, 16)
    grads = []
    for config in (plain, with_dge):
        layer = QuantLinear.from_linear(base, config, seed=0)
        layer.weight.grad = None
        layer(x).backward(grad_y)
        grads.append(layer.weight.grad.clone())
    from fp4cli import quantize

    units = quantize(base.weight.detach(), spec).grid_units(base.weight.detach())
    torch.testing.assert_close(grads[1], grads[0] * dge_derivative(units, E2M1, DGEConfig()))


def test_guided_rounding_picks_the_point_nearer_the_guide():
    spec = QuantSpec.preset("mxfp4")  # scale 1 for a block with amax in [4, 8)
    w = torch.tensor([[4.0, 1.2, 1.2, 2.6, -2.6, 0.1, 0.4, 0.3] + [0.0] * 24])
    guide = torch.tensor([[4.0, 1.45, 1.05, 2.1, -2.9, 0.4, 0.1, -5.0] + [0.0] * 24])
    q = fake_quantize(w, spec, guide=guide)
    assert q[0, :8].tolist() == [4.0, 1.5, 1.0, 2.0, -3.0, 0.5, 0.0, 0.0]
    assert fake_quantize(w, spec)[0, :8].tolist() == [4.0, 1.0, 1.0, 3.0, -3.0, 0.0, 0.5, 0.5]


def test_qema_updates_after_each_optimizer_step_and_guides_after_warmup():
    config = LinearConfig(
        forward_w=QuantSpec.preset("mxfp4-ceil"), qema=QEMAConfig(beta=0.5, warmup=2)
    )
    layer = QuantLinear(32, 4, config=config, seed=0)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    attach_qema(layer, optimizer)
    w0 = layer.weight.detach().clone()
    for step in range(3):
        optimizer.zero_grad()
        layer(torch.randn(5, 32)).sum().backward()
        optimizer.step()
        if step == 0:  # the first update copies the weight
            assert torch.equal(layer.weight_ema, layer.weight.detach())
    assert int(layer.ema_updates) == 3
    assert not torch.equal(layer.weight_ema, w0)
    guide = layer._weight_guide()
    assert torch.equal(guide, layer.weight_ema)  # warm: the EMA guides the rounding
    expected = fake_quantize(layer.weight, config.forward_w, guide=layer.weight_ema)
    x = torch.eye(32)
    torch.testing.assert_close(layer(x) - layer.bias, expected.T, rtol=0, atol=1e-6)


def test_qema_before_warmup_equals_plain_rounding():
    spec = QuantSpec.preset("mxfp4-ceil")
    layer = QuantLinear(32, 4, config=LinearConfig(forward_w=spec, qema=QEMAConfig()), seed=0)
    x = torch.eye(32)
    expected = fake_quantize(layer.weight.detach(), spec)
    torch.testing.assert_close(layer(x) - layer.bias, expected.T, rtol=0, atol=1e-6)


def test_outlier_clamp_linear_is_torch_quantile():
    x = torch.randn(6, 200)
    x[2, 10] = 1000.0
    clamped, residual = clamp_outliers(x, OutlierConfig(0.99, method="linear"))
    assert torch.equal(clamped + residual, x)
    high = torch.quantile(x, 0.99, dim=-1, keepdim=True)
    low = torch.quantile(x, 0.01, dim=-1, keepdim=True)
    torch.testing.assert_close(clamped, torch.minimum(torch.maximum(x, low), high))
    assert (residual != 0).float().mean() < 0.05  # sparse
    assert clamped[2].max() < 10


@pytest.mark.parametrize(
    "make",
    [
        lambda: OutlierConfig(quantile=1.5),
        lambda: QEMAConfig(beta=1.0),
        lambda: QEMAConfig(warmup=-1),
        lambda: DGEConfig(k=0.5),
        lambda: DGEConfig(cap=0.1),
    ],
)
def test_technique_configs_validate(make):
    with pytest.raises(SpecError):
        make()
