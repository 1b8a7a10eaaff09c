"""QuEST's trust estimator (`linear.trust`): the gradient of a forward operand is zero where its
value lay beyond the grid, worked by hand; with a forward Hadamard transform the mask acts in the
transform's basis and the gradient is brought back, as QuEST's and Quartet's code compute it."""

import dataclasses

import pytest
import torch

from fp4cli.linear import LinearConfig, QuantLinear
from fp4cli.linear.fast import fast_gap
from fp4cli.linear.fast_vector import vector_gap
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.backend import interpreter_on, triton_available
from fp4cli.recipes import load_recipe
from fp4cli.techniques import DGEConfig, HadamardConfig, TrustConfig
from fp4cli.techniques.hadamard import FixedSigns, inverse_rht, rht
from fp4cli.techniques.trust import trust_mask

MXFP4 = QuantSpec()


def test_the_mask_by_hand():
    """E2M1 (largest 6); v the values in grid units, q what they rounded to (5 -> 4, a tie)."""
    v = torch.tensor([-7.0, -6.0, -5.99, 0.0, 5.0, 6.5, 7.0])
    q = torch.tensor([-6.0, -6.0, -6.0, 0.0, 4.0, 6.0, 6.0])
    clip = trust_mask(v, q, TrustConfig(), 6.0)  # Quartet: |v| < 6
    assert clip.tolist() == [False, False, True, True, True, False, False]
    wider = trust_mask(v, q, TrustConfig(bound=1.0), 6.0)  # |v| < 7
    assert wider.tolist() == [False, True, True, True, True, True, False]
    error = trust_mask(v, q, TrustConfig("error", 1.0), 6.0)  # |v - q| <= 1: all
    assert error.all()
    lloyd = trust_mask(v, q, TrustConfig("error", 0.6541), 6.0)  # QuEST's code's bound
    assert lloyd.tolist() == [False, True, True, True, False, True, False]
    nan = trust_mask(torch.tensor([float("nan")]), torch.tensor([0.0]), TrustConfig(), 6.0)
    assert not nan.any()


def layer(config: LinearConfig, weight: torch.Tensor) -> QuantLinear:
    module = QuantLinear(weight.shape[1], weight.shape[0], bias=False, config=config, seed=0,
                         backend="torch")  # fmt: skip
    module.weight.data.copy_(weight)
    return module


def test_clipped_activations_get_no_gradient():
    """OCP MXFP4 along in_features (32): row 0's amax 7 gives the scale 2^(2 - 2) = 1, so 7
    lies beyond 6 (clipped); row 1's amax 6 gives the same scale and 6 sits on the grid's
    edge, where Quartet's strict |v| < 6 masks it too. Everything else passes."""
    x = torch.zeros(2, 32)
    x[0, 0], x[0, 1], x[1, 0], x[1, 1] = 7.0, 1.0, 6.0, 3.0
    x.requires_grad_(True)
    weight = torch.randn(3, 32)
    dy = torch.randn(2, 3)
    module = layer(LinearConfig(forward_x=MXFP4, trust=TrustConfig()), weight)
    module(x).backward(dy)
    expected = dy @ weight
    expected[0, 0] = expected[1, 0] = 0.0
    assert torch.equal(x.grad, expected)
    assert torch.equal(module.weight.grad, dy.t() @ x.detach())  # W is not quantized
    assert module.executor()[0] == "reference"


def test_the_error_rule_on_the_weight():
    """W row [5, 0.3, 0, ...]: amax 5, scale 1; 5 rounds to 4 (a tie, to even): error 1, which
    QuEST's code's bound 0.654 masks and the bound 1 passes; 0.3 -> 0.5 (error 0.2) passes."""
    weight = torch.zeros(2, 32)
    weight[0, 0], weight[0, 1], weight[1, 0] = 5.0, 0.3, 1.0
    x = torch.randn(4, 32)
    dy = torch.randn(4, 2)
    full = dy.t() @ x
    for bound, masked in ((0.6541, True), (1.0, False)):
        module = layer(LinearConfig(forward_w=MXFP4, trust=TrustConfig("error", bound)), weight)
        module(x).backward(dy)
        expected = full.clone()
        if masked:
            expected[0, 0] = 0.0
        assert torch.equal(module.weight.grad, expected)


def test_quest_backward_is_the_straight_through_gradient_in_the_rotated_basis():
    """The quest recipe (Hadamard 128 without signs, RMS-fitted FP32 row scales, backward in
    high precision from the quantized operands) against autograd through QuEST's formulation,
    x_had * mask + (Q(x_had) - x_had * mask).detach() for X and W; a trust bound of 0.3 units
    here, so that values inside the grid are masked too."""
    config = dataclasses.replace(load_recipe("quest").linear, trust=TrustConfig("error", 0.3))
    spec, trust = config.forward_x, config.trust
    torch.manual_seed(0)
    x = (torch.randn(6, 48) * 3).requires_grad_(True)  # 48 in_features: padded to 128
    weight = torch.randn(5, 48)
    module = layer(config, weight)
    dy = torch.randn(6, 5)
    module(x).backward(dy)

    def straight_through(t):
        rotated = rht(t, 1, 128, None)
        q = quantize(rotated.detach(), spec, axis=1)
        units = q.grid_units(rotated.detach())
        grid = q.layout.unpad(q.element_values())
        mask = trust_mask(units, grid, trust, 6.0).float()
        return rotated * mask + (q.dequantize() - rotated * mask).detach(), mask

    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = weight.clone().requires_grad_(True)
    x_st, x_mask = straight_through(x_ref)
    w_st, w_mask = straight_through(w_ref)
    (x_st @ w_st.t()).backward(dy)
    assert 0 < x_mask.mean() < 1 and 0 < w_mask.mean() < 1
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-5)
    assert torch.allclose(module.weight.grad, w_ref.grad, atol=1e-5)


def test_double_quantization_after_a_forward_transform():
    """Quartet's backward: W and X re-quantized from the forward's rotated Q(W R), Q(X R); dX R
    masked by X's clip mask and brought back by R^T (deterministic transforms and RNE here, so
    the operands can be written out)."""
    fixed = HadamardConfig(32, random=False)
    backward = QuantSpec(sr_prescale=1.0)
    quest = QuantSpec.preset("mxfp4-quest")
    config = LinearConfig(forward_x=quest, forward_w=quest, grad_input_dy=backward,
                          grad_input_w=backward, grad_weight_dy=backward, grad_weight_x=backward,
                          forward_hadamard=fixed, grad_input_hadamard=fixed,
                          grad_weight_hadamard=fixed, double_quant=True,
                          trust=TrustConfig())  # fmt: skip
    torch.manual_seed(1)
    x = torch.randn(64, 40).requires_grad_(True)
    x.data[0, :4] = 9.0  # a row whose rotated values clip
    weight = torch.randn(24, 40)
    module = layer(config, weight)
    dy = torch.randn(64, 24)
    module(x).backward(dy)

    signs = FixedSigns()
    x_rot, w_rot = rht(x.detach(), 1, 32, None), rht(weight, 1, 32, None)
    x_q, w_q = fake_quantize(x_rot, quest), fake_quantize(w_rot, quest)
    q = quantize(x_rot, quest)
    mask = q.grid_units(x_rot).abs() < 6
    assert not mask.all()
    dy_q = fake_quantize(dy, backward, axis=1, hadamard=32, hadamard_seed=signs)
    w_b = fake_quantize(w_q, backward, axis=0, hadamard=32, hadamard_seed=signs)
    grad_x = inverse_rht(torch.where(mask, dy_q.mm(w_b), 0.0), 1, 32, None, 40)
    assert torch.equal(x.grad, grad_x)
    dy_t = fake_quantize(dy, backward, axis=0, hadamard=32, hadamard_seed=signs)
    x_b = fake_quantize(x_q, backward, axis=0, hadamard=32, hadamard_seed=signs)
    w_mask = quantize(w_rot, quest).grid_units(w_rot).abs() < 6
    grad_w = inverse_rht(torch.where(w_mask, dy_t.t().mm(x_b), 0.0), 1, 32, None, 40)
    assert torch.equal(module.weight.grad, grad_w)


KERNELS = triton_available() and (interpreter_on() or torch.cuda.is_available())
SR = QuantSpec(rounding="sr")


@pytest.mark.skipif(not KERNELS, reason="the kernels need TRITON_INTERPRET=1 or a CUDA GPU")
@pytest.mark.parametrize(
    ("trust", "double_quant"),
    [(TrustConfig("clip", 0.5), True), (TrustConfig("error", 0.25), False)],
)
def test_the_kernels_give_the_references_bits(trust, double_quant):
    """backend "triton" (the quantize kernels: forward operands, their masks, the backward
    operands) against "torch", bit for bit over two calls: random forward signs, SR forward
    and backward, a Q-EMA-free weight; the mask's quantization must repeat the forward's."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = LinearConfig(forward_x=SR, forward_w=SR, grad_input_dy=SR, grad_input_w=SR,
                          grad_weight_dy=SR, grad_weight_x=SR,
                          forward_hadamard=HadamardConfig(32), double_quant=double_quant,
                          trust=trust)  # fmt: skip
    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(40, 72, generator=generator) * 3).to(device)
    x[3, :6] = 30.0  # rotated values that clip
    weight = torch.randn(24, 72, generator=generator).to(device)
    dy = torch.randn(40, 24, generator=generator).to(device)
    grads = {}
    for backend in ("torch", "triton"):
        module = QuantLinear(72, 24, bias=False, config=config, seed=11, backend=backend)
        module = module.to(device)
        module.weight.data.copy_(weight)
        assert module.executor()[0] == "reference"
        passes = []
        for _ in range(2):
            x_in = x.clone().requires_grad_(True)
            module.zero_grad()
            module(x_in).backward(dy)
            passes.append((x_in.grad, module.weight.grad.clone()))
        grads[backend] = passes
    for (gx, gw), (kx, kw) in zip(grads["torch"], grads["triton"], strict=True):
        assert torch.equal(gx, kx) and torch.equal(gw, kw)
    assert not torch.equal(grads["torch"][0][0], grads["torch"][1][0])  # fresh seeds a call
    # some gradient was masked: compare with the same layer without the estimator
    plain = QuantLinear(72, 24, bias=False, config=dataclasses.replace(config, trust=None),
                        seed=11, backend="torch").to(device)  # fmt: skip
    plain.weight.data.copy_(weight)
    x_in = x.clone().requires_grad_(True)
    plain(x_in).backward(dy)
    assert not torch.equal(x_in.grad, grads["torch"][0][0])


def test_where_it_runs_and_what_it_refuses():
    trusted = LinearConfig(forward_x=MXFP4, trust=TrustConfig())
    assert fast_gap(trusted).startswith("the trust estimator")
    assert vector_gap(trusted) == "the trust estimator"
    rotated = LinearConfig(forward_x=MXFP4, forward_hadamard=HadamardConfig(32),
                           grad_input_dy=MXFP4, double_quant=True)  # fmt: skip
    assert fast_gap(rotated) == "double quantization after a forward Hadamard transform"
    assert "trust" in trusted.summary()
    # the fitted scale rules: neither fused executor claims them (the reference fits them)
    fitted = LinearConfig(forward_x=QuantSpec.preset("mxfp4-quest"), forward_w=MXFP4)
    assert fast_gap(fitted).startswith("forward_x: scale_rule 'std' (kernels: floor, ceil")
    assert vector_gap(fitted).startswith("forward_x: scale_rule 'std'")
    row = LinearConfig(forward_x=QuantSpec.preset("fp4-row-rms"))
    assert vector_gap(row).startswith("forward_x: scale_rule 'rms'")
    for fields, message in (
        ({}, "trust: needs a quantized forward operand"),
        ({"forward_w": MXFP4, "dge": DGEConfig()}, "trust: cannot be combined with DGE"),
    ):
        with pytest.raises(SpecError, match=message):
            LinearConfig(trust=TrustConfig(), **fields)
    with pytest.raises(SpecError, match="rule: must be one of clip, error"):
        TrustConfig("median")
    with pytest.raises(SpecError, match=r"bound: must be a number in \[0, 64\]"):
        TrustConfig(bound=-1.0)
