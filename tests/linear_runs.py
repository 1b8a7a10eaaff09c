"""Training passes through one QuantLinear, for the tests that compare its executors (fast,
vector-wise, reference) bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp4cli import QuantLinear
from fp4cli.replay import replays
from tests.kernel_cases import DEVICE
from tests.kernel_checks import assert_same_sum


def seeded_layer(config, backend, in_features=96, out_features=70, bias=True):
    torch.manual_seed(1)
    return QuantLinear(
        in_features, out_features, bias=bias, config=config, seed=3, backend=backend
    ).to(DEVICE)


def training_passes(layer, x, grad_y, calls=2):
    """(output, grad of x, grads of the parameters) of `calls` passes (each draws fresh seeds)."""
    results = []
    for _ in range(calls):
        x_in = x.detach().clone().requires_grad_(x.requires_grad)
        layer.zero_grad()
        y = layer(x_in)
        y.backward(grad_y)
        results.append((y.detach(), x_in.grad, *(p.grad for p in layer.parameters())))
    return results


def assert_same_passes(got, expected, summed_bias=False):
    """Every tensor equal bit for bit, a missing gradient missing on both sides. summed_bias:
    the last tensor of each pass is the bias gradient, the same sum added in another order."""
    for got_call, expected_call in zip(got, expected, strict=True):
        exact = got_call[:-1] if summed_bias else got_call
        for a, b in zip(exact, expected_call, strict=False):
            assert (a is None and b is None) or torch.equal(a, b)
        assert len(got_call) == len(expected_call)
        if summed_bias:
            assert_same_sum(got_call[-1], expected_call[-1], "bias gradient")


def linear_inputs(shape=(2, 37, 96), out_features=70, seed=0, outlier=False):
    """x (requires grad) and grad_y on DEVICE; with `outlier`, one value a clamp takes off."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * 3
    if outlier:
        x.view(-1, shape[-1])[5, 7] = 40.0
    grad_y = torch.randn(*shape[:-1], out_features, generator=generator)
    return x.to(DEVICE).requires_grad_(), grad_y.to(DEVICE)


def saved_tensors(layer, x) -> list[torch.Tensor]:
    """The tensors autograd saves for the backward pass of layer(x)."""
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(x)
    return saved


def gemm_layouts(layer, x, grad_y) -> list[tuple]:
    """(shape, strides) of both operands of every matrix product of one training pass: cuBLAS
    picks its kernel, and so its summation order, by them."""
    layouts = []
    real_mm, real_linear = torch.Tensor.mm, F.linear

    def record(*operands):
        layouts.append(tuple((tuple(t.shape), t.stride()) for t in operands))

    def mm(a, b):
        record(a, b)
        return real_mm(a, b)

    def linear(a, w, bias=None):
        record(a, w)
        return real_linear(a, w, bias)

    with pytest.MonkeyPatch.context() as patch, replays(False):  # the Python calls, not replays
        patch.setattr(torch.Tensor, "mm", mm)
        patch.setattr(F, "linear", linear)
        training_passes(layer, x, grad_y, calls=1)
    return layouts


def assert_same_gemm_layouts(config, outlier=False):
    """Every GEMM of one training pass gets operands of the same shapes and strides on the
    layer's kernel executor (backend "triton") as on the reference: cuBLAS chooses its kernel,
    and so the float32 summation order, by them."""
    x, grad_y = linear_inputs((19, 45), 33, seed=2, outlier=outlier)
    layouts = [
        gemm_layouts(seeded_layer(config, backend, 45, 33), x, grad_y)
        for backend in ("triton", "torch")
    ]
    assert len(layouts[0]) == 3 and layouts[0] == layouts[1]
    for backend in ("triton", "torch"):
        grad = arriving_weight_grad(seeded_layer(config, backend, 45, 33), x, grad_y)
        # in the parameter's layout, autograd keeps it; transposed, it copies it every step
        assert grad.shape == (33, 45) and grad.is_contiguous(), backend


def arriving_weight_grad(layer, x, grad_y) -> torch.Tensor:
    """The weight gradient as the layer's backward returns it, before autograd accumulates it."""
    arrived = []
    handle = layer.weight.register_hook(arrived.append)
    try:
        training_passes(layer, x, grad_y, calls=1)
    finally:
        handle.remove()
    return arrived[0]
