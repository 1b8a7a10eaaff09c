"""TetraJet's "double quantization" of the backward operands.

The backward GEMMs need W blocked along out_features and X blocked along tokens. With double
quantization they re-quantize the dequantized forward operands Q(W), Q(X) along the new
dimension (so the straight-through gradient is that of the forward's quantized tensors); without
it, they quantize the high-precision W and X.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def backward_source(
    high_precision: torch.Tensor, forward_dequantized: torch.Tensor, double_quant: bool
) -> torch.Tensor:
    """The tensor a backward operand quantizer reads."""
    return forward_dequantized if double_quant else high_precision
