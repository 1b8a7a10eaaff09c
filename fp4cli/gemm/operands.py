"""The GEMM's inputs checked, and viewed as the kernels' 2-D operands.

a: a QuantizedTensor of shape (*, K), or a float tensor (*, K) (weight-only); b: a
QuantizedTensor (N, K). Both quantized tensors are blocked along K, their last axis. The result
has shape (*, N).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fp4cli.quant import QuantizedTensor, QuantSpec

if TYPE_CHECKING:
    from fp4cli.kernels.gemm.launch import Operand

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KERNEL_BLOCKS = (32, 64, 96, 128, 160, 192, 224, 256)  # whole 32-element windows per block


class GemmError(ValueError):
    """An impossible GEMM request (shapes, axes, dtypes, devices, modes); one line that says
    what to change."""


def check_inputs(a: QuantizedTensor | torch.Tensor, b: QuantizedTensor) -> tuple[int, int]:
    """(K, N) of a valid pair, or GemmError."""
    if not isinstance(b, QuantizedTensor):
        raise GemmError(f"b must be a QuantizedTensor (N, K) (got {type(b).__name__})")
    _check_blocked_along_k("b", b)
    if len(b.shape) != 2:
        raise GemmError(f"b must be 2-D (N, K) (got shape {tuple(b.shape)})")
    if isinstance(a, QuantizedTensor):
        _check_blocked_along_k("a", a)
        device = a.codes.device
    elif isinstance(a, torch.Tensor):
        if not torch.is_floating_point(a) or a.dim() == 0:
            raise GemmError(f"a must be a QuantizedTensor or a float tensor (*, K) (got {a.dtype})")
        device = a.device
    else:
        raise GemmError(f"a must be a QuantizedTensor or a tensor (got {type(a).__name__})")
    k, n = b.shape[1], b.shape[0]
    if a.shape[-1] != k:
        raise GemmError(f"a has K = {a.shape[-1]} but b has K = {k} (a is (*, K), b is (N, K))")
    if device != b.codes.device:
        raise GemmError(f"a is on {device} but b on {b.codes.device}")
    return k, n


def _check_blocked_along_k(name: str, q: QuantizedTensor) -> None:
    if q.axis != len(q.shape) - 1:
        raise GemmError(
            f"{name} is quantized along axis {q.axis}; the GEMM needs its blocks along K, the "
            "last axis (quantize with axis=-1)"
        )


def check_out(
    out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    if dtype not in OUT_DTYPES:
        raise GemmError(f"out_dtype must be bfloat16, float16 or float32 (got {dtype})")
    if out is None:
        return
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device:
        raise GemmError(
            f"out must be a {dtype} tensor of shape {shape} on {device} "
            f"(got {out.dtype} {tuple(out.shape)} on {out.device})"
        )


def check_bias(bias: torch.Tensor | None, n: int, device: torch.device) -> None:
    """A GemmError unless the bias is None or a floating-point (N,) tensor on the device."""
    if bias is None:
        return
    if bias.shape != (n,) or not bias.is_floating_point() or bias.device != device:
        raise GemmError(
            f"bias must be a floating-point tensor of shape ({n},) on {device} "
            f"(got {bias.dtype} {tuple(bias.shape)} on {bias.device})"
        )


def kernel_gap(a: QuantizedTensor | torch.Tensor, b: QuantizedTensor) -> str | None:
    """Why the GEMM kernels cannot take this pair, or None when they can."""
    if isinstance(a, QuantizedTensor):
        return spec_pair_gap(a.spec, b.spec)
    if a.dtype not in OUT_DTYPES:
        return f"a of dtype {a.dtype} (weight-only takes bfloat16, float16 or float32)"
    return spec_gap("b", b.spec)


def spec_pair_gap(a: QuantSpec, b: QuantSpec, names: tuple[str, str] = ("a", "b")) -> str | None:
    """Why the GEMM kernels cannot multiply operands quantized with these specs (called
    `names` in the answer), or None."""
    gap = spec_gap(names[0], a) or spec_gap(names[1], b)
    if gap is None and a.block != b.block:
        return f"blocks of {a.block} and {b.block} (both operands need one block)"
    return gap


def spec_gap(name: str, spec: QuantSpec) -> str | None:
    """Why the GEMM kernels cannot take an operand of this spec (called `name`), or None."""
    if spec.element != "e2m1" or spec.scale != "e8m0":
        return f"{name}'s {spec.element}/{spec.scale} (mxfp4_matmul takes e2m1/e8m0)"
    if spec.block not in KERNEL_BLOCKS or spec.tile2d:
        return f"{name}'s block {spec.block!r} (mxfp4_matmul takes multiples of 32 up to 256)"
    if spec.tensor_scale:
        return f"{name}'s tensor scale (mxfp4_matmul takes one level of e8m0 scales)"
    if spec.sr_prescale != 1.0:
        return f"{name}'s sr_prescale {spec.sr_prescale:g} (dequantized values are not q * 2^e)"
    return None


def kernel_operand(q: QuantizedTensor) -> Operand:
    """The kernels' (rows, K_padded / 2) codes and (rows, K_padded / block) scales of q."""
    from fp4cli.kernels.gemm.launch import Operand

    codes = q.codes.reshape(-1, q.codes.shape[-1]).contiguous()
    scales = q.scales.reshape(-1, q.scales.shape[-1]).contiguous()
    return Operand(codes, scales, int(q.spec.block))
