"""Packed codes with signed zeros (`quantize(..., signed_zero=True)`): a negative value that
rounds to zero is written as code 8 (-0), as torchao's NVFP4Tensor and Blackwell's conversion
write it. Worked out by hand on the reference, then the kernels against the reference bit for
bit on every rounding and layout they take. Interpreter on the CPU, or a GPU."""

import pytest
import torch

from fp4cli.formats import unpack_nibbles
from fp4cli.quant import QuantSpec, quantize
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    MXFP4,
    NVFP4,
    NVFP4_SR,
    assert_bits,
    edge_blocks,
    on_device,
)
from tests.kernel_checks import assert_same_quantized

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

SPECS = {
    "mxfp4": MXFP4,
    "mxfp4-ceil-away": QuantSpec.preset("mxfp4-ceil", rounding="away"),
    "nvfp4": NVFP4,
    "nvfp4-sr": NVFP4_SR,
    "nvfp4-4over6": QuantSpec.preset("nvfp4-4over6"),
    "nvfp4-eden": QuantSpec.preset("nvfp4-eden"),
    "nvfp4-outer128": QuantSpec.preset("nvfp4-outer128"),
    "e1m2": QuantSpec.preset("nvfp4", element="e1m2"),
}


def _codes(qt) -> list[int]:
    return unpack_nibbles(qt.codes).reshape(-1).tolist()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_codes_by_hand(backend):
    """MXFP4, one block of amax 6 (scale 1): -0.2 and 0.2 round to 0 (below 0.25), -0.25 too
    (a tie, to the even code 0); -0.0 stays -0; 0.3 -> 0.5, -3 -> code 13. With signed zeros
    the negative ones are code 8, otherwise 0; the values are equal."""
    x = torch.zeros(1, 32)
    x[0, :7] = torch.tensor([6.0, -0.2, 0.2, -0.25, -0.0, 0.3, -3.0])
    x = on_device(x)
    plain = quantize(x, MXFP4, backend=backend)
    signed = quantize(x, MXFP4, backend=backend, signed_zero=True)
    assert _codes(plain)[:7] == [7, 0, 0, 0, 0, 1, 13]
    assert _codes(signed)[:7] == [7, 8, 0, 8, 8, 1, 13]
    assert _codes(signed)[7:] == [0] * 25  # +0 stays code 0
    assert torch.equal(plain.dequantize(), signed.dequantize())
    assert torch.signbit(signed.dequantize()[0, 1]).item()


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("axis", [0, 1])
def test_the_kernels_write_the_references_signed_zeros(name, axis):
    x = edge_blocks(seed=3) * 0.25  # many values round to zero
    x[8, :40] = -0.0
    spec = SPECS[name]
    options = dict(axis=axis, seed=5, signed_zero=True)
    reference = quantize(x, spec, backend="torch", **options)
    kernel = quantize(x, spec, backend="triton", **options)
    assert_same_quantized(kernel, reference)
    eights = (unpack_nibbles(reference.codes) == 8).sum().item()
    assert eights > 0, "the case holds negative zeros"
    plain = quantize(x, spec, backend="triton", axis=axis, seed=5)
    # the same codes but for the sign of zero, and the same values
    assert_bits(unpack_nibbles(plain.codes), unpack_nibbles(kernel.codes) & ~_eights(kernel))
    assert_bits(plain.scales, kernel.scales, "scale codes")


def _eights(qt) -> torch.Tensor:
    """8 where a code is 8 (-0), else 0 (uint8)."""
    codes = unpack_nibbles(qt.codes)
    return torch.where(codes == 8, 8, 0).to(torch.uint8)


def test_with_a_hadamard_transform():
    x = edge_blocks(seed=4)[7:] * 0.1
    options = dict(seed=2, hadamard=16, hadamard_seed=9, signed_zero=True)
    reference = quantize(x, NVFP4_SR, backend="torch", **options)
    assert_same_quantized(quantize(x, NVFP4_SR, backend="triton", **options), reference)
