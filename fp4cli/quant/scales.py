"""Block scales and the two-level tensor scale, exactly as the numerics contract defines them."""

from __future__ import annotations

import math

import torch

from fp4cli.formats import Minifloat, ScaleFormat, decode, encode, round_to_grid
from fp4cli.quant.spec import QuantSpec


def divide(numerator: torch.Tensor, denominator: float) -> torch.Tensor:
    """numerator / denominator, correctly rounded on every device. (CUDA turns a division by a
    Python number into a multiplication by its rounded reciprocal; a tensor divisor is divided.)"""
    return numerator / torch.full_like(numerator, denominator)


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent as float32, exact for integer exponents down to -149 (via float64)."""
    return torch.exp2(exponent.to(torch.float64)).to(torch.float32)


def floor_log2(positive: torch.Tensor) -> torch.Tensor:
    """floor(log2(x)) for positive finite float32 x (subnormals too), exact, as int64."""
    _, exp = torch.frexp(positive)
    return (exp - 1).to(torch.int64)


def pow2_scale_exponent(
    amax: torch.Tensor, spec: QuantSpec, element_max: float | None = None
) -> torch.Tensor:
    """The E8M0 exponent of each block (int64), before clamping and zero handling.

    floor: floor(log2 amax) - floor(log2 emax), the OCP rule.
    ceil: ceil(log2(amax / emax)), the smallest exponent with amax <= emax * 2^e.
    emax is the element format's largest value, or `element_max` (four-over-six's 4).
    """
    emax = element_max or spec.element_format.max_value
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    exponent = floor_log2(safe) - math.floor(math.log2(emax))
    if spec.scale_rule == "ceil":
        # emax * 2^e in float64 is exact over fp32's whole range, subnormals included.
        reach = emax * torch.exp2(exponent.to(torch.float64))
        exponent = exponent + (safe.to(torch.float64) > reach).to(torch.int64)
    return exponent


def _round_scale_minifloat(raw: torch.Tensor, fmt: Minifloat, rule: str) -> torch.Tensor:
    """amax / emax rounded onto an unsigned minifloat scale grid (nearest even, or up)."""
    rounded = round_to_grid(raw, fmt, "up" if rule == "ceil" else "rne")
    return torch.clamp(rounded, min=fmt.min_positive)


def _round_scale_float(raw: torch.Tensor, fmt: ScaleFormat, rule: str) -> torch.Tensor:
    if fmt.dtype_name == "float32":
        return torch.clamp(raw, min=fmt.min_value)
    rounded = raw.to(torch.bfloat16).to(torch.float32)
    if rule == "ceil":
        as_bf16 = rounded.to(torch.bfloat16)
        up = torch.nextafter(as_bf16, torch.full_like(as_bf16, float("inf"))).to(torch.float32)
        rounded = torch.where(rounded < raw, up, rounded)
    return torch.clamp(rounded, min=fmt.min_value, max=fmt.max_value)


def block_scales(
    amax: torch.Tensor, spec: QuantSpec, element_max: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale values as float32, stored scales) for each block's finite amax (float32, >= 0),
    mapping it onto the element format's largest value (or `element_max`).

    Stored scales are uint8 codes for e8m0/ue5m3/ue4m3 and floats for fp32/bf16. An all-zero
    block gets the smallest scale the format stores.
    """
    fmt = spec.scale_format
    if fmt.kind == "pow2":
        exponent = pow2_scale_exponent(amax, spec, element_max)
        exponent = torch.where(amax > 0, exponent, torch.full_like(exponent, fmt.min_exponent))
        exponent = exponent.clamp(fmt.min_exponent, fmt.max_exponent)
        return pow2(exponent), (exponent + fmt.exponent_bias).to(torch.uint8)
    raw = divide(amax, element_max or spec.element_format.max_value)
    if fmt.kind == "minifloat":
        assert fmt.minifloat is not None
        values = _round_scale_minifloat(raw, fmt.minifloat, spec.scale_rule)
        return values, encode(values, fmt.minifloat)
    values = _round_scale_float(raw, fmt, spec.scale_rule)
    stored = values.to(torch.bfloat16) if fmt.dtype_name == "bfloat16" else values
    return values, stored


def scale_values(stored: torch.Tensor, fmt: ScaleFormat) -> torch.Tensor:
    """Float32 scale values of stored scales; NaN codes give NaN."""
    if fmt.kind == "pow2":
        codes = stored.to(torch.int64)
        values = pow2(codes - fmt.exponent_bias)
        return torch.where(codes == fmt.nan_code, torch.full_like(values, float("nan")), values)
    if fmt.kind == "minifloat":
        assert fmt.minifloat is not None
        return decode(stored, fmt.minifloat)
    return stored.to(torch.float32)


def nan_scales(like: torch.Tensor, fmt: ScaleFormat) -> torch.Tensor:
    """Stored NaN scales with the shape and storage type of `like`."""
    if fmt.is_code:
        return torch.full_like(like, fmt.nan_code)
    return torch.full_like(like, float("nan"))
