"""DGE's factor on the weight gradient in kernels (kernels/vector/dge.py, `dge_scale_gradient`)
against the reference `grad * dge_derivative(weight / scale).to(grad.dtype)`, bit for bit: every
grid point, interval middle (t = 0, the cap), the closed last interval, weights beyond the grid, NaN
and Inf lines, zeros and subnormals, for E2M1, E4M3 and E5M2 scales per row, column and tensor,
several k and caps, and a transposed gradient."""

from __future__ import annotations

import pytest
import torch

from fp4cli.kernels.vector.launch import dge_scale_gradient, quantize_vector, scaled_by
from fp4cli.quant import QuantSpec
from fp4cli.techniques.dge import DGEConfig, dge_derivative
from tests.kernel_cases import DEVICE, INF, NAN, assert_bits

SPECS = {
    "fp4-column": QuantSpec.preset("fp4-column"),
    "fp4-row": QuantSpec.preset("fp4-row"),
    "fp4-row-ceil": QuantSpec(block="row", scale_rule="ceil"),
    "e4m3-column": QuantSpec(element="e4m3", block="column"),
    "e5m2-tensor": QuantSpec.preset("fp8-e5m2-tensor"),
}
CONFIGS = [DGEConfig(), DGEConfig(k=3.0), DGEConfig(k=2.0, cap=1.0), DGEConfig(k=100.0, cap=1e6)]


def dge_weight(rows: int, cols: int, spec: QuantSpec, device, seed: int = 0) -> torch.Tensor:
    """Gaussian weights whose first rows and columns hold the format's grid points, interval
    middles and its largest value at scale 1 (each such row and column has amax = the largest
    value), values just beyond it, NaN and Inf (unless the scale is the tensor's), zeros and
    subnormals; cut to (rows, cols) from at least (8, 45)."""
    full_rows, full_cols = max(rows, 8), max(cols, 45)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(full_rows, full_cols, generator=generator) * 0.02
    top = spec.element_format.max_value
    grid = torch.tensor(sorted({spec.element_format.decode_magnitude(c) for c in range(64)}))
    grid = grid[grid <= top]
    middles = (grid[:-1] + grid[1:]) / 2
    points = torch.cat([grid, -middles, torch.tensor([top, -top, top * 1.01])])[:full_cols]
    weight[0, : points.numel()] = points  # along a row (row scales: amax = top * 1.01)
    weight[: points.numel(), 1] = points[:full_rows]  # down a column
    weight[2, 5:9] = torch.tensor([NAN if spec.block != "tensor" else 2.0, 1.0, -0.0, 3e-42])
    weight[3, 4] = INF if spec.block != "tensor" else -3.0
    weight[4] = 0.0
    weight[5, :] = torch.tensor([1e-40, -2.5e-39]).repeat(full_cols)[:full_cols]
    return weight[:rows, :cols].contiguous().to(device)


def check_dge_gradient(weight, grad, spec, config) -> None:
    """The kernels' product against the reference's, every bit."""
    _, scales = quantize_vector(weight, spec, 1, torch.float32, scales=True)
    assert scales is not None
    by = scaled_by(spec, 1)
    scale = scales[:, None] if by == "row" else scales[None, :] if by == "column" else scales
    derivative = dge_derivative(weight.float() / scale, spec.element_format, config)
    expected = grad * derivative.to(grad.dtype)
    got = dge_scale_gradient(grad.clone(), weight, scales, spec, config)
    assert_bits(got, expected, f"{spec.short()} k={config.k} cap={config.cap}")


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"k{c.k:g}-cap{c.cap:g}")
def test_dge_factor_matches_the_reference(name, config):
    spec = SPECS[name]
    weight = dge_weight(37, 45, spec, DEVICE)
    grad = torch.randn(37, 45, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    check_dge_gradient(weight, grad, spec, config)


def test_transposed_gradient_and_ragged_shapes():
    """The weight gradient of the executor is a transposed view; shapes not tile multiples."""
    spec = SPECS["fp4-column"]
    for rows, cols in ((1, 1), (3, 130), (70, 3)):
        weight = dge_weight(rows, cols, spec, DEVICE, seed=rows)
        grad = torch.randn(cols, rows, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        check_dge_gradient(weight, grad.t(), spec, DGEConfig())


def test_inverse_k_is_the_float32_quotient():
    """1 / k as float32 divides it (what CUDA's division by a number multiplies with)."""
    for k in (3.0, 5.0, 7.0, 2.5, 100.0):
        expected = torch.tensor(1.0) / torch.tensor(k)
        assert DGEConfig(k=k).inverse_k == expected.item()
