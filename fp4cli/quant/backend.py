"""Which implementation runs a quantization: the PyTorch reference or the Triton kernels.

backend="torch": the reference, on any device. backend="triton": the fused kernels of
`fp4cli.kernels`, on a CUDA tensor (or on the CPU under TRITON_INTERPRET=1); a configuration
they do not cover is an error. backend="auto": the kernels for a CUDA tensor whose
configuration they cover, else the reference. Both give the same bits.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from fp4cli.quant.spec import QuantSpec, SpecError

BACKENDS = ("torch", "triton", "auto")
KERNEL_BLOCKS = (8, 16, 32, 64, 128, 256)
KERNEL_SCALES = ("e8m0", "ue5m3", "ue4m3")
KERNEL_ELEMENTS = ("e2m1", "e1m2")
KERNEL_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNEL_OUTER_MAX = 1024  # an outer block lies within one tile along the axis
KERNEL_ROUNDINGS = ("rne", "sr", "away", "eden")
KERNEL_SCALE_RULES = ("floor", "ceil")  # from the amax; not the fitted "rms" / "std"


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise SpecError(f"backend: must be one of {', '.join(BACKENDS)} (got {backend!r})")


# Looked up once, at import: torch.compile then reads a constant (it warns on cached functions).
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    return _TRITON_INSTALLED


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernel_gap(spec: QuantSpec, dtype: torch.dtype) -> str | None:
    """Why the kernels cannot run this configuration, or None when they can."""
    if spec.element not in KERNEL_ELEMENTS:
        return f"element {spec.element!r} (the kernels quantize to {', '.join(KERNEL_ELEMENTS)})"
    if spec.block not in KERNEL_BLOCKS or spec.tile2d:
        return f"block {spec.block!r}{' tile2d' if spec.tile2d else ''} (kernels: {KERNEL_BLOCKS})"
    if spec.scale not in KERNEL_SCALES:
        return f"scale {spec.scale!r} (kernels: {', '.join(KERNEL_SCALES)})"
    rule_gap = scale_rule_gap(spec)
    if rule_gap is not None:
        return rule_gap
    outer = spec.outer_block
    if outer and (outer & (outer - 1) or outer > KERNEL_OUTER_MAX):
        return f"outer_block {spec.outer_block} (kernels: a power of two up to {KERNEL_OUTER_MAX})"
    if spec.rounding not in KERNEL_ROUNDINGS:
        return f"rounding {spec.rounding!r} (kernels: {', '.join(KERNEL_ROUNDINGS)})"
    group = spec.eden_group
    if spec.rounding == "eden" and group & (group - 1):
        return f"eden_group {group} (kernels: a power of two)"
    if dtype not in KERNEL_INPUT_DTYPES:
        return f"input dtype {dtype} (kernels: float32, bfloat16, float16)"
    return None


def scale_rule_gap(spec: QuantSpec) -> str | None:
    """Why no kernel (the quantize kernels, the vector-wise ones) computes this spec's block
    scales, or None: they scale from the amax ("floor", "ceil"), not from the RMS."""
    if spec.scale_rule not in KERNEL_SCALE_RULES:
        rules = ", ".join(KERNEL_SCALE_RULES)
        return f"scale_rule {spec.scale_rule!r} (kernels: {rules}; the reference fits it)"
    return None


def use_kernels(
    backend: str,
    spec: QuantSpec,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> bool:
    """Whether a call on a `dtype` tensor on `device` runs the Triton kernels (raises for an
    impossible backend="triton")."""
    check_backend(backend)
    if backend == "torch":
        return False
    gap = kernel_gap(spec, dtype)
    on_cuda = device.type == "cuda"
    runnable = triton_available() and (on_cuda or interpreter_on())
    if backend == "auto":
        return gap is None and on_cuda and runnable
    if gap is not None:
        raise SpecError(f"backend 'triton' does not cover {gap}; use backend 'torch' or 'auto'")
    if not runnable:
        raise SpecError(
            "backend 'triton' needs triton and a CUDA tensor (or TRITON_INTERPRET=1 on the CPU)"
        )
    return True
