"""Double-block NVFP4 (QuantSpec.outer_block, TetraJet-v2's): an FP32 second-level scale per
outer block instead of per tensor. Worked by hand here; the oracle (tests/oracle.py, via
test_quantize's matrix) checks it bit for bit on every kind of input."""

import pytest
import torch

from fp4cli.analysis.quant_inspect import Variant, measure
from fp4cli.cost.operands import needs_amax_pass
from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast import fast_gap
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.backend import kernel_gap
from fp4cli.quant.blocking import BlockLayout
from fp4cli.recipes import load_recipe

OUTER = QuantSpec.preset("nvfp4-outer128")


def _two_outer_blocks() -> torch.Tensor:
    """Outer block 0 holds 2688 = 448 * 6 (its global scale is 1) and (3, 1); outer block 1
    holds only (0.6, 0.1)."""
    x = torch.zeros(1, 256)
    x[0, 0] = 2688.0
    x[0, 16], x[0, 17] = 3.0, 1.0
    x[0, 128], x[0, 129] = 0.6, 0.1
    return x


def test_each_outer_block_has_its_own_scale():
    # Outer block 1: G = 2688 / 0.6 = 4480, its block's scale E4M3(0.6 * 4480 / 6 = 448) = 448,
    # elements x * 10 = (6, 1), decoded q * (448 * 0.6) / 2688 = (0.6, 0.1): exact.
    qt = quantize(_two_outer_blocks(), OUTER)
    assert qt.tensor_amax is not None and qt.tensor_amax.shape == qt.scales.shape
    assert qt.tensor_amax[0, :8].tolist() == [2688.0] * 8
    assert qt.tensor_amax[0, 8:].tolist() == pytest.approx([0.6] * 8)
    assert qt.scale_values()[0, :2].tolist() == [448.0, 0.5]
    assert qt.scale_values()[0, 8].item() == 448.0
    out = qt.dequantize()
    assert out[0, [0, 16, 17]].tolist() == [2688.0, 3.0, 1.0]
    assert out[0, 128].item() == pytest.approx(0.6, rel=1e-6)
    assert out[0, 129].item() == pytest.approx(0.1, rel=1e-6)
    # one tensor scale (G = 1) gives the small block scale E4M3(0.1) = 0.1015625 instead
    plain = fake_quantize(_two_outer_blocks(), QuantSpec.preset("nvfp4"))
    assert plain[0, 128].item() == pytest.approx(6 * 0.1015625)
    assert plain[0, 129].item() == pytest.approx(0.1015625)


def test_outer_block_along_any_axis_and_padding():
    x = torch.randn(200, 3, generator=torch.Generator().manual_seed(2))
    x[:64] *= 1000.0  # the first outer block of 64 rows is far larger than the rest
    spec = OUTER.replace(outer_block=64)
    qt = quantize(x, spec, axis=0)  # 200 rows: 4 outer blocks, the last one partial
    assert qt.tensor_amax is not None
    assert qt.tensor_amax.shape == qt.scales.shape == (3, 13)
    assert torch.equal(qt.tensor_amax[:, 4], x[64:128].abs().amax(dim=0))
    assert torch.equal(qt.tensor_amax[:, 12], x[192:].abs().amax(dim=0))
    small = (fake_quantize(x, spec, axis=0) - x)[64:].square().mean()
    one_scale = (fake_quantize(x, QuantSpec.preset("nvfp4"), axis=0) - x)[64:].square().mean()
    assert small < one_scale


def test_stored_bytes_count_one_fp32_scale_per_outer_block():
    layout = BlockLayout.for_tensor((4, 256), OUTER)
    assert layout.stored_bytes(OUTER) == (512, 4 * 16 + 4 * 2 * 4)


def test_no_separate_amax_pass_and_run_by_the_kernels():
    assert not needs_amax_pass(OUTER) and needs_amax_pass(QuantSpec.preset("nvfp4"))
    assert not OUTER.whole_tensor_scale and QuantSpec.preset("nvfp4").whole_tensor_scale
    assert kernel_gap(OUTER, torch.float32) is None
    assert fast_gap(LinearConfig(forward_x=OUTER)) is None
    assert fast_gap(load_recipe("tetrajet-v2").linear) is None
    gap = fast_gap(LinearConfig(forward_x=OUTER.replace(outer_block=48)))
    assert gap == "forward_x: outer_block 48 (kernels: a power of two up to 1024)"


def test_inspect_reports_no_single_tensor_scale():
    got = measure(torch.randn(64, 256), Variant("nvfp4-outer128", OUTER))
    assert got.tensor_scale is None and got.rel_mse > 0


def test_recipe_follows_the_code():
    linear = load_recipe("tetrajet-v2").linear
    for name in ("forward_x", "forward_w"):
        assert linear.spec(name) == OUTER
    for name in ("grad_input_dy", "grad_input_w", "grad_weight_dy", "grad_weight_x"):
        assert linear.spec(name) == OUTER.replace(rounding="sr")
    for gemm in ("grad_input", "grad_weight"):
        hadamard = linear.hadamard(gemm)
        assert hadamard is not None and hadamard.size == 16 and hadamard.random
    assert linear.hadamard("forward") is None and linear.double_quant


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"outer_block": 128}, "needs tensor_scale"),
        ({"outer_block": 24, "tensor_scale": True, "scale": "ue4m3", "block": 16}, "multiple"),
        ({"outer_block": 8192, "tensor_scale": True, "scale": "ue4m3", "block": 16}, "4096"),
        ({"outer_block": 128, "tensor_scale": True, "scale": "ue4m3", "block": 16,
          "tile2d": True}, "tile2d"),
        ({"outer_block": True, "tensor_scale": True, "scale": "ue4m3"}, "integer"),
    ],
    ids=str,
)  # fmt: skip
def test_validation(changes, message):
    with pytest.raises(SpecError, match=message):
        QuantSpec(**changes)


def test_resolved_recipes_keep_their_form():
    assert "outer_block" not in str(load_recipe("nvfp4").to_dict())
    assert OUTER.short() == "e2m1/ue4m3/16/floor/rne/ts/outer128"
