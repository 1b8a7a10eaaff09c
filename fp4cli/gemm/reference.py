"""The definition of the MXFP4 GEMM: a.dequantize() @ b.dequantize().T, in float64.

Every product of an E2M1 value and an E8M0 scale pair is exact in float64, and so are sums
over any K this project meets, unless the operands span more than ~2^50 in magnitude: this is
the exact result, rounded once to the output dtype. The kernels' exact mode promises the
float32 accumulation of the same products, within float32 summation error of it.
"""

from __future__ import annotations

import torch

from fp4cli.quant import QuantizedTensor


def matmul_reference(
    a: QuantizedTensor | torch.Tensor,
    b: QuantizedTensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """(*, N) = dequantize(a) @ dequantize(b)^T computed in float64, in `out_dtype`."""
    a_values = a.dequantize(torch.float64) if isinstance(a, QuantizedTensor) else a.double()
    b_values = b.dequantize(torch.float64)
    return (a_values @ b_values.T).to(out_dtype)
