"""Two-level (NVFP4) scaling: TransformerEngine's order of operations, pinned to vectors worked
out by hand from the formulas in `fp4cli.quant.two_level`, and compared with torchao's
`nvfp4_quantize` where torchao is installed and the two references agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp4cli.formats import unpack_nibbles
from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.quant.two_level import decode_factors, encode_multipliers, global_encode_scale

NVFP4 = QuantSpec.preset("nvfp4")
F32 = np.float32


def _codes(qt) -> list[int]:
    return unpack_nibbles(qt.codes).reshape(-1).tolist()


def test_scales_in_the_reference_order():
    """amax 10: G = 2688 / 10 = 268.8 (float32 268.8), D = 1 / G = 0.0037202383,
    G * fl(1/6) = 44.8. Block 0 (amax 10): 10 * 44.8 = 448 -> E4M3 448; block 1 (amax 0.7):
    0.7 * 44.8 = 31.359999 -> E4M3 32 (the grid there is 28, 30, 32)."""
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 10.0, -2.5
    x[0, 16], x[0, 17] = 0.7, 0.3
    qt = quantize(x, NVFP4)
    assert qt.tensor_amax is not None and qt.tensor_amax.item() == 10.0
    assert global_encode_scale(qt.tensor_amax, NVFP4).item() == F32(268.8)
    assert qt.scale_values().tolist() == [[448.0, 32.0]]
    # Block 0 encodes with 1 / (448 * D) = 0.59999996, not 6 / 10 = 0.6: 10 -> 5.9999995
    # rounds to 6 all the same, -2.5 -> -1.4999999 rounds to -1.5.
    multipliers = encode_multipliers(qt.scale_values(), qt.tensor_amax, NVFP4)
    assert multipliers[0, 0].item() == F32(0.59999996)
    codes = _codes(qt)
    assert codes[0] == 7 and codes[1] == 0b1011  # +6 and -1.5
    # Block 1: 1 / (32 * D) = 8.4; 0.7 * 8.4 = 5.88 -> 6, 0.3 * 8.4 = 2.52 -> 3 (nearest).
    assert codes[16] == 7 and codes[17] == 5
    # Decoding: (448 * 10) * fl(1/2688) = 1.6666667; (32 * 10) * fl(1/2688) = 0.11904762.
    factors = decode_factors(qt.scale_values(), qt.tensor_amax, NVFP4)
    assert factors.tolist() == [[F32(1.6666667), F32(0.11904762)]]
    out = qt.dequantize()
    assert out[0, 0].item() == F32(6 * F32(1.6666667))  # 10.0
    assert out[0, 1].item() == F32(-1.5 * F32(1.6666667))
    assert out[0, 17].item() == F32(3 * F32(0.11904762))


def test_a_block_scale_that_rounds_to_zero_decodes_to_zero():
    """amax 1000 beside a block of amax 1e-4: 1e-4 * (2.688 / 6) = 4.5e-5, under half the
    smallest E4M3 subnormal (2^-9): the scale is 0, the elements saturate (the encode multiplier
    is the float32 max) and decode to 0, as TransformerEngine's reference does."""
    x = torch.zeros(1, 32)
    x[0, 0] = 1000.0
    x[0, 16], x[0, 17] = 1e-4, -5e-5
    qt = quantize(x, NVFP4)
    assert qt.scale_values()[0, 1].item() == 0.0
    codes = _codes(qt)
    assert codes[16] == 7 and codes[17] == 15
    assert fake_quantize(x, NVFP4)[0, 16:].abs().max().item() == 0.0


def test_an_all_zero_tensor():
    qt = quantize(torch.zeros(2, 16), NVFP4)
    assert qt.tensor_amax.item() == 0.0
    assert global_encode_scale(qt.tensor_amax, NVFP4).item() == torch.finfo(torch.float32).max
    assert qt.scale_values().abs().max().item() == 0.0
    assert qt.dequantize().abs().max().item() == 0.0


def test_sr_prescale_and_guide_scale_alike():
    """The SR pre-scale multiplies after the encode multiplier and divides after decoding."""
    spec = NVFP4.replace(rounding="sr", sr_prescale=0.75)
    x = torch.linspace(-3, 3, 64).reshape(2, 32)
    qt = quantize(x, spec, seed=5)
    units = qt.grid_units(x)
    multipliers = encode_multipliers(qt.scale_values(), qt.tensor_amax, spec)
    blocks = x.reshape(2, 2, 16) * multipliers.unsqueeze(-1) * 0.75
    assert torch.equal(units, blocks.reshape(2, 32))


def _torchao():
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
    except Exception:  # torchao is optional; any import failure means "not installed"
        return None
    return nvfp4_quantize


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_and_scales_equal_torchao_where_the_orders_agree(dtype):
    """torchao divides where TransformerEngine multiplies by reciprocals (docs/numerics.md).
    With the tensor amax at 448 * 6, G = D = 1 and both compute s = E4M3(a / 6) (as a * fl(1/6)
    here, which rounds to the same scale unless it lands on an E4M3 tie) and x * fl(1/s).
    Their dequantization differs: torchao decodes q * s, TransformerEngine
    q * ((s * 2688) * fl(1/2688))."""
    nvfp4_quantize = _torchao()
    if nvfp4_quantize is None:
        pytest.skip("torchao is not installed")
    from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=generator) * torch.logspace(-1, 1, 128)
    x = (x * (2688.0 / x.abs().max())).to(dtype)
    ours = quantize(x, NVFP4)
    assert ours.tensor_amax.item() == x.abs().max().float().item()
    scales, codes = nvfp4_quantize(x, 16, per_tensor_amax_to_scale(x.abs().max().float()))
    assert torch.equal(ours.scales, scales.view(torch.uint8).reshape(ours.scales.shape))
    packed = codes.view(torch.uint8).reshape(ours.codes.shape)
    # by default fp4cli writes every zero as code 0; torchao keeps the sign of a negative value
    # that rounds to zero (code 8, -0): equal values, a different code (docs/numerics.md)
    theirs = unpack_nibbles(packed)
    assert (theirs == 8).any()
    assert torch.equal(unpack_nibbles(ours.codes), torch.where(theirs == 8, 0, theirs))
    # with signed zeros the packed bytes are torchao's, byte for byte
    assert torch.equal(quantize(x, NVFP4, signed_zero=True).codes, packed)
