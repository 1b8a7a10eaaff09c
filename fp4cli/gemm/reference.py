"""The definitions of the FP4 GEMMs, in float64.

MXFP4 (`matmul_reference`): a.dequantize() @ b.dequantize().T. Every product of an E2M1 value
and an E8M0 scale pair is exact in float64, and so are sums over any K this project meets,
unless the operands span more than ~2^50 in magnitude: this is the exact result, rounded once
to the output dtype. The kernels' exact mode promises the float32 accumulation of the same
products, within float32 summation error of it.

NVFP4 (`nvfp4_matmul_reference`): Blackwell's block-scaled GEMM, which multiplies the
block-scaled elements and applies the two tensors' decode scales once, in the epilogue:

    D[m, n] = out( fl32( alpha * sum_k (q_a s_a)[m, k] (q_b s_b)[n, k] ) )
    alpha   = fl32( fl32(amax_a * amax_b) / fl32((S_a E) (S_b E)) )

q: E2M1 values, s: the E4M3 block scales, amax: the tensors' `tensor_amax`, S E: the spec's
two-level constant (`two_level.constants`: 448 * 6 = 2688 for nvfp4). Each q s is exact in
float64 (and in bfloat16), the sum is exact in float64 for any K met here, the product with
alpha is rounded once to float32 and then to the output dtype, as the kernels' epilogue does.
It is not `a.dequantize() @ b.dequantize().T`: dequantization rounds every element.
"""

from __future__ import annotations

import torch

from fp4cli.quant import QuantizedTensor, QuantSpec
from fp4cli.quant.two_level import constants


def matmul_reference(
    a: QuantizedTensor | torch.Tensor,
    b: QuantizedTensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """(*, N) = dequantize(a) @ dequantize(b)^T (+ bias (N,)) computed in float64, in
    `out_dtype`."""
    a_values = a.dequantize(torch.float64) if isinstance(a, QuantizedTensor) else a.double()
    b_values = b.dequantize(torch.float64)
    sums = a_values @ b_values.T
    return (sums if bias is None else sums + bias.double()).to(out_dtype)


def nvfp4_factor(a: QuantizedTensor, b: QuantizedTensor) -> float:
    """(S_a E) (S_b E): what alpha divides the amax product by (2688^2 for two nvfp4 tensors;
    exact in float32 for every two-level E2M1 spec)."""
    return block_scaled_factor(a.spec, b.spec)


def block_scaled_factor(a: QuantSpec, b: QuantSpec) -> float:
    """`nvfp4_factor` of tensors quantized with these two-level specs."""
    return constants(a)[0] * constants(b)[0]


def nvfp4_alpha(a: QuantizedTensor, b: QuantizedTensor) -> torch.Tensor:
    """alpha = fl32(fl32(amax_a * amax_b) / factor), a 0-d float32 tensor on a's device."""
    assert a.tensor_amax is not None and b.tensor_amax is not None, "needs two-level operands"
    return block_scaled_alpha(a.tensor_amax, b.tensor_amax, nvfp4_factor(a, b))


def block_scaled_alpha(amax_a: torch.Tensor, amax_b: torch.Tensor, factor: float) -> torch.Tensor:
    """`nvfp4_alpha` from the two tensor amaxes and `block_scaled_factor`."""
    amax_a, amax_b = (t.to(torch.float32).reshape(()) for t in (amax_a, amax_b))
    divisor = torch.tensor(factor, dtype=torch.float32, device=amax_a.device)
    return (amax_a * amax_b) / divisor


def block_scaled_values(q: QuantizedTensor) -> torch.Tensor:
    """(*, K_padded) float64 q * s of each element (NaN in NaN blocks), the padded layout."""
    block = int(q.spec.block)
    scales = q.scale_values().to(torch.float64).repeat_interleave(block, dim=-1)
    return q.element_values().to(torch.float64) * scales


def nvfp4_matmul_reference(
    a: QuantizedTensor, b: QuantizedTensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """(*, N) = out(fl32(alpha * sum_k (q_a s_a)(q_b s_b))) for a (*, K) and b (N, K) two-level
    E2M1 tensors blocked along K (see the module); sums in float64."""
    a_values = block_scaled_values(a)  # (*, K_padded); padding holds zero codes
    b_values = block_scaled_values(b)  # (N, K_padded)
    sums = a_values @ b_values.T
    alpha = nvfp4_alpha(a, b).to(sums.device, torch.float64)
    return (alpha * sums).to(torch.float32).to(out_dtype)
