"""The quantized Linear: LinearConfig, the autograd function, QuantLinear, quantize_model."""

from fp4cli.linear.config import GEMMS, OPERANDS, LinearConfig
from fp4cli.linear.function import QuantLinearFunction
from fp4cli.linear.module import (
    QuantLinear,
    attach_qema,
    executor_summary,
    quantize_model,
    quantized_layers,
    update_qema,
)

__all__ = [
    "GEMMS",
    "OPERANDS",
    "LinearConfig",
    "QuantLinear",
    "QuantLinearFunction",
    "attach_qema",
    "executor_summary",
    "quantize_model",
    "quantized_layers",
    "update_qema",
]
