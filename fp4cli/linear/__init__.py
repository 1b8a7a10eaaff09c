"""The quantized Linear: LinearConfig, the autograd functions, QuantLinear, quantize_model.

Imported lazily (PEP 562): `fp4cli.linear.config` and the recipe files read without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "GEMMS": "fp4cli.linear.operands",
    "OPERANDS": "fp4cli.linear.operands",
    "LinearConfig": "fp4cli.linear.config",
    "QuantLinearFunction": "fp4cli.linear.function",
    "QuantLinear": "fp4cli.linear.module",
    "attach_qema": "fp4cli.linear.module",
    "executor_summary": "fp4cli.linear.module",
    "quantize_model": "fp4cli.linear.module",
    "quantized_layers": "fp4cli.linear.module",
    "update_qema": "fp4cli.linear.module",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from fp4cli.linear.config import LinearConfig as LinearConfig
    from fp4cli.linear.function import QuantLinearFunction as QuantLinearFunction
    from fp4cli.linear.module import QuantLinear as QuantLinear
    from fp4cli.linear.module import attach_qema as attach_qema
    from fp4cli.linear.module import executor_summary as executor_summary
    from fp4cli.linear.module import quantize_model as quantize_model
    from fp4cli.linear.module import quantized_layers as quantized_layers
    from fp4cli.linear.module import update_qema as update_qema
    from fp4cli.linear.operands import GEMMS as GEMMS
    from fp4cli.linear.operands import OPERANDS as OPERANDS


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fp4cli.linear' has no attribute {name!r}")
