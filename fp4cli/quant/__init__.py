"""The quantizer: QuantSpec, quantize, fake_quantize (pure PyTorch reference).

Imported lazily (PEP 562): `fp4cli.quant.spec` and the recipe files read without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "QuantSpec": "fp4cli.quant.spec",
    "SpecError": "fp4cli.quant.spec",
    "QuantizedTensor": "fp4cli.quant.reference",
    "fake_quantize": "fp4cli.quant.reference",
    "quantize": "fp4cli.quant.reference",
}

__all__ = ["QuantSpec", "QuantizedTensor", "SpecError", "fake_quantize", "quantize"]

if TYPE_CHECKING:
    from fp4cli.quant.reference import QuantizedTensor as QuantizedTensor
    from fp4cli.quant.reference import fake_quantize as fake_quantize
    from fp4cli.quant.reference import quantize as quantize
    from fp4cli.quant.spec import QuantSpec as QuantSpec
    from fp4cli.quant.spec import SpecError as SpecError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fp4cli.quant' has no attribute {name!r}")
