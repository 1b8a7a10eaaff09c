"""GEMMs of FP8 operands on the FP8 tensor cores: `fp8_mm` multiplies two tensors of one-byte
E4M3 / E5M2 codes, each with one power-of-two scale (the vector-wise kernels' codes,
`fp4cli.kernels.vector.launch.quantize_codes`), through cuBLAS (`torch._scaled_mm`).

Both operands are given with K contiguous, as the tensor cores read them: a as (M, K) codes and
b as its transpose's (N, K) codes. The products of the codes are exact and the power-of-two
scales multiply the sum exactly, so the result differs from the product of the dequantized
values (`linear.gemm: dequantized`: exact products, float32 sums) only in how the tensor cores
add (in chunks of limited precision, promoted to float32: cuBLAS's accumulation with fast
accumulation off): about 1e-4 of the largest output, against BF16's 4e-3 rounding. Where the
device has no FP8 tensor cores (before sm_89, the CPU) or a dimension is no multiple of 16,
`fp8_mm` decodes the codes and multiplies the values instead, which is the dequantized route's
product.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from fp4cli.quant.spec import QuantSpec

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
ALIGNMENT = 16  # cuBLAS's FP8 GEMMs want every dimension a multiple of 16


def fp8_spec_gap(name: str, spec: QuantSpec) -> str | None:
    """Why an operand of this spec (called `name`) cannot be multiplied by `fp8_mm`, or None."""
    if spec.element not in FP8_DTYPES:
        return f"{name}'s element {spec.element!r} (FP8 tensor cores: e4m3, e5m2)"
    if spec.block != "tensor" or spec.scale != "e8m0" or spec.tensor_scale:
        return f"{name}'s {spec.block!r} {spec.scale} scales (the FP8 route: one e8m0 per tensor)"
    if spec.sr_prescale != 1.0:
        return f"{name}'s sr_prescale {spec.sr_prescale:g} (values are not code * scale)"
    return None


def fp8_pair_gap(a: QuantSpec, b: QuantSpec, names: tuple[str, str]) -> str | None:
    """Why `fp8_mm` cannot multiply operands of these specs, or None."""
    gap = fp8_spec_gap(names[0], a) or fp8_spec_gap(names[1], b)
    if gap is None and a.element == b.element == "e5m2":
        return "two e5m2 operands (the FP8 tensor cores pair e5m2 with e4m3 only)"
    return gap


def tensor_cores(device: torch.device) -> bool:
    """Whether `device` multiplies FP8 on its tensor cores (CUDA, sm_89 and later)."""
    return device.type == "cuda" and _capability(device.index) >= (8, 9)


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def fp8_mm(
    a: tuple[torch.Tensor, torch.Tensor],
    b_t: tuple[torch.Tensor, torch.Tensor],
    specs: tuple[QuantSpec, QuantSpec],
    dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """a @ b + bias in `dtype`, from a = (codes (M, K), scale) and b_t = (codes (N, K), scale)
    of b's transpose, uint8 codes of `specs` (a's, b's) with one float32 scale each (NaN for a
    tensor that had NaN or Inf: the product is then NaN). The bias joins the sums before their
    one rounding (on the tensor cores, a bf16 bias to a bf16 output: cuBLAS's epilogue takes
    no other; any other is added to the rounded product there)."""
    (a_codes, a_scale), (b_codes, b_scale) = a, b_t
    a_spec, b_spec = specs
    aligned = all(size % ALIGNMENT == 0 for size in (*a_codes.shape, b_codes.shape[0]))
    if aligned and tensor_cores(a_codes.device):
        # cuBLAS adds a bf16 bias to a bf16 output in its epilogue; any other, after
        in_epilogue = bias is not None and bias.dtype == dtype == torch.bfloat16
        product = torch._scaled_mm(
            a_codes.view(FP8_DTYPES[a_spec.element]),
            b_codes.view(FP8_DTYPES[b_spec.element]).t(),
            a_scale,
            b_scale,
            bias=bias if in_epilogue else None,
            out_dtype=dtype,
            use_fast_accum=False,
        )
        return product if bias is None or in_epilogue else product.add_(bias)
    from fp4cli.kernels.vector.launch import decode_vector

    a_values = decode_vector(a_codes, a_scale, a_spec, 1, dtype)
    b_values = decode_vector(b_codes, b_scale, b_spec, 1, dtype)
    return F.linear(a_values, b_values, None if bias is None else bias.to(dtype))
