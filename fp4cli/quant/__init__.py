"""The quantizer: QuantSpec, quantize, fake_quantize (pure PyTorch reference)."""

from fp4cli.quant.quantize import QuantizedTensor, fake_quantize, quantize
from fp4cli.quant.spec import QuantSpec, SpecError

__all__ = ["QuantSpec", "QuantizedTensor", "SpecError", "fake_quantize", "quantize"]
