"""mxfp4_matmul: the MXFP4 GEMM on whatever the device has, and which path it takes.

Paths (`gemm_path`), for two quantized operands the kernels cover (`operands.kernel_gap`):

- "hopper" (compute capability 8.9 and 9.x, and the Triton interpreter): exact on INT8 / FP8
  tensor cores in tiers (`fp4cli.kernels.gemm.launch.exact_matmul`); fast through cuBLAS's
  row-wise scaled FP8 GEMM where it takes the shapes (bf16 output, M, N and K multiples of 16),
  else the FP8 kernel with promotion every K-tile.
- "blackwell" (10.x and later, block 32): Triton's `tl.dot_scaled`, the native MXFP4 MMA.
- "bf16" (other CUDA GPUs): dequantize to bfloat16 (exact) and the ordinary GEMM.
- "reference" (the CPU, backend "torch", or what the kernels do not cover): `matmul_reference`.
A float `a` (weight-only) takes "weight-only" (B decoded in registers) where kernels run.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fp4cli.gemm.operands import (
    GemmError,
    check_bias,
    check_inputs,
    check_out,
    kernel_gap,
    kernel_operand,
)
from fp4cli.gemm.reference import matmul_reference
from fp4cli.quant import QuantizedTensor
from fp4cli.quant.backend import check_backend, interpreter_on, triton_available
from fp4cli.quant.spec import SpecError

GEMM_MODES = ("exact", "fast")


def mxfp4_matmul(
    a: QuantizedTensor | torch.Tensor,
    b: QuantizedTensor,
    out_dtype: torch.dtype = torch.bfloat16,
    mode: str = "exact",
    backend: str = "auto",
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """a.dequantize() @ b.dequantize().T (+ bias), shape (*, N), for a (*, K) and b (N, K)
    quantized along K (their last axis); `a` may be a float tensor (weight-only). bias: an
    optional (N,) tensor added, in its dtype's values, to the sums before their one rounding to
    `out_dtype`, as cuBLAS's epilogue (and `F.linear`) adds it.

    mode "exact": the float32 accumulation of the exact products (the numbers a
        dequantize-then-float32 GEMM gives, up to float32 summation order); rows or columns
        holding a NaN block give NaN.
    mode "fast": on Hopper, blocks more than 11 binades (cuBLAS path) or 26 binades (FP8
        kernel) below their row's largest scale are flushed, and the tensor cores' 14-bit
        accumulation runs over several 32-element windows between float32 promotions.
    backend: "torch" (the float64 reference), "triton" (the kernels; an error where they cannot
        run) or "auto". out: an optional output tensor of the result's shape and `out_dtype`.
    """
    check_backend(backend)
    if mode not in GEMM_MODES:
        raise GemmError(f"mode must be one of {', '.join(GEMM_MODES)} (got {mode!r})")
    _, n = check_inputs(a, b)
    lead = tuple(a.shape[:-1])
    device = b.codes.device
    check_out(out, (*lead, n), out_dtype, device)
    check_bias(bias, n, device)
    path = gemm_path(a, b, backend)
    if path == "reference":
        result = matmul_reference(a, b, out_dtype, bias)
        return out.copy_(result) if out is not None else result
    target = out if out is not None else torch.empty((*lead, n), dtype=out_dtype, device=device)
    rows = math.prod(lead)
    if target.numel() == 0:
        return target
    flat = _flat_view(target, rows, n)
    written = flat if flat is not None else torch.empty((rows, n), dtype=out_dtype, device=device)
    _run(path, a, b, written, mode, bias)
    if flat is None:
        target.copy_(written.reshape(target.shape))
    return target


def gemm_path(a: QuantizedTensor | torch.Tensor, b: QuantizedTensor, backend: str = "auto") -> str:
    """Which implementation `mxfp4_matmul` uses for this pair and backend (see the module)."""
    check_backend(backend)
    if backend == "torch":
        return "reference"
    gap = kernel_gap(a, b)
    device = b.codes.device
    runnable = triton_available() and (device.type == "cuda" or interpreter_on())
    if backend == "triton":
        if gap is not None:
            raise SpecError(f"backend 'triton' does not cover {gap}; use backend 'torch' or 'auto'")
        if not runnable:
            raise SpecError(
                "backend 'triton' needs triton and CUDA tensors (or TRITON_INTERPRET=1 on the CPU)"
            )
    elif gap is not None or device.type != "cuda" or not runnable:
        return "reference"
    if not isinstance(a, QuantizedTensor):
        return "weight-only"
    if device.type != "cuda":
        return "hopper"  # the interpreter runs the Hopper kernels
    capability = torch.cuda.get_device_capability(device)
    if capability >= (10, 0) and b.spec.block == 32:
        return "blackwell"
    if capability >= (8, 9):
        return "hopper"
    return "bf16"


def _run(
    path: str,
    a: QuantizedTensor | torch.Tensor,
    b: QuantizedTensor,
    out: torch.Tensor,
    mode: str,
    bias: torch.Tensor | None,
) -> None:
    from fp4cli.kernels.gemm import launch as gemm_launch
    from fp4cli.kernels.host.launch import launches_skipped

    if launches_skipped():  # a custom op's fake implementation: the output's layout only
        return
    b_operand = kernel_operand(b)
    if path == "weight-only":
        assert isinstance(a, torch.Tensor)
        gemm_launch.weight_only_matmul(a.reshape(-1, a.shape[-1]), b_operand, out, bias=bias)
        return
    assert isinstance(a, QuantizedTensor)
    if path == "bf16":  # bf16 holds every value exactly; cuBLAS accumulates in float32
        dtype = torch.bfloat16 if out.dtype == torch.bfloat16 else torch.float32
        values = a.dequantize(dtype).reshape(-1, a.shape[-1])
        out.copy_(F.linear(values, b.dequantize(dtype), None if bias is None else bias.to(dtype)))
        return
    a_operand = kernel_operand(a)
    if path == "blackwell":
        gemm_launch.scaled_dot_matmul(a_operand, b_operand, out, bias=bias)
    elif mode == "exact":
        gemm_launch.exact_matmul(a_operand, b_operand, out, bias=bias)
    elif gemm_launch.cublas_fast_supported(a_operand, b_operand, out, bias):
        gemm_launch.fast_cublas_matmul(a_operand, b_operand, out, bias=bias)
    else:
        gemm_launch.fp8_matmul(a_operand, b_operand, out, exact=False, bias=bias)


def _flat_view(target: torch.Tensor, rows: int, n: int) -> torch.Tensor | None:
    """A (rows, n) view of the output the kernels can write (any 2-D strides), or None."""
    if target.dim() == 2:
        return target
    if target.is_contiguous():
        return target.view(rows, n)
    return None
