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


# MS-AMP's scale (`bf16_scale_exponent`): for amax in this range every bfloat16 intermediate is
# a normal number; outside it the exact rule applies (both clamp to E8M0's range long before).
BF16_SCALE_RANGE = (2.0**-100, 2.0**100)
# r = 2^k (1 + m / 128) (a bfloat16), L = log2 r in [k, k + 1): L rounds to k + 1 in bfloat16
# when 1 - (L - k) is below half of bfloat16's spacing at k + 1, 2^h: i.e. from this m on, by h
# (exact: log2(1 + m / 128) > 1 - 2^h holds from m = 128 (2^(1 - 2^h) - 1), never an integer).
BF16_LOG_ROUNDS_UP_FROM = {-9: 128, -8: 128, -7: 127, -6: 126, -5: 123, -4: 118, -3: 107,
                           -2: 88, -1: 54}  # fmt: skip


def bf16_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """The E8M0 exponent (int64) of MS-AMP's FP4 scale for E2M1 (`compute_scaling_factor` on a
    bfloat16 amax: sf = 2^floor(log2(6 / amax)), the scale 1 / sf): with a = amax rounded to
    bfloat16, r = bf16(bf16(1 / a) * 6) (each step a float32 operation rounded to bfloat16, to
    nearest even) and L = log2(r) rounded to bfloat16, -floor(L). For r = 2^k (1 + m / 128),
    floor(L) is k, or k + 1 where L rounds up to it (`BF16_LOG_ROUNDS_UP_FROM`). Equal to the
    exact ceil rule or one lower (a scale half as large: values above 3 times it clip)."""
    a = amax.to(torch.bfloat16).to(torch.float32)
    reciprocal = (torch.ones_like(a) / a).to(torch.bfloat16).to(torch.float32)
    r = (reciprocal * 6.0).to(torch.bfloat16).to(torch.float32)  # the product exact in float32
    k = floor_log2(r)
    mantissa = (r.view(torch.int32) >> 16) & 0x7F
    return -(k + (mantissa >= _rounds_up_from(k + 1)).to(torch.int64))


def _rounds_up_from(target: torch.Tensor) -> torch.Tensor:
    """The least mantissa m (of `BF16_LOG_ROUNDS_UP_FROM`) from which log2 rounds up to the
    integer `target` (int64), 128 (never) for 0: half of bfloat16's spacing at |target| is
    2^(j - 8), j = floor(log2 |target|); just below a positive power of two 2^(j - 9)."""
    magnitude = target.abs().clamp(min=1)
    j = floor_log2(magnitude.to(torch.float32))
    below_power = (target > 0) & (magnitude == (1 << j))
    half_spacing = (j - 8 - below_power.to(torch.int64)).clamp(-9, -1)
    table = torch.tensor([BF16_LOG_ROUNDS_UP_FROM[h] for h in range(-9, 0)], device=target.device)
    return torch.where(target == 0, 128, table[half_spacing + 9])


def pow2_scale_exponent(
    amax: torch.Tensor, spec: QuantSpec, element_max: float | None = None
) -> torch.Tensor:
    """The E8M0 exponent of each block (int64), before clamping and zero handling.

    floor: floor(log2 amax) - floor(log2 emax), the OCP rule.
    ceil: ceil(log2(amax / emax)), the smallest exponent with amax <= emax * 2^e; with
    `spec.scale_bf16`, MS-AMP's bfloat16 arithmetic for amax in BF16_SCALE_RANGE
    (`bf16_scale_exponent`).
    emax is the element format's largest value, or `element_max` (four-over-six's 4).
    """
    emax = element_max or spec.element_format.max_value
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    exponent = floor_log2(safe) - math.floor(math.log2(emax))
    if spec.scale_rule == "ceil":
        # emax * 2^e in float64 is exact over fp32's whole range, subnormals included.
        reach = emax * torch.exp2(exponent.to(torch.float64))
        exponent = exponent + (safe.to(torch.float64) > reach).to(torch.int64)
    if spec.scale_bf16:
        low, high = BF16_SCALE_RANGE
        in_range = (amax >= low) & (amax <= high)
        exponent = torch.where(in_range, bf16_scale_exponent(safe), exponent)
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


def fitted_block_scales(
    blocks: torch.Tensor, real: torch.Tensor, spec: QuantSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale values as float32, stored scales) fitted to each block's spread, for the scale
    rules "rms" and "std" (QuEST's Gaussian fit; `blocks` finite, zero-padded; `real` (bool,
    same shape) marks the tensor's values, not padding).

    With n the block's real values, m = sum(x) / n and r = sqrt(sum(x^2) / n) ("rms") or
    sqrt(sum((x - m)^2) / n) ("std"), all in float64: s = rms_clip / emax * r, rounded once to
    float32. Then onto the scale format: e8m0 the largest power of two at or below s
    (2^floor(log2 s), Quartet's rounding), ue5m3 / ue4m3 / bf16 to nearest even, fp32 s
    itself, clamped to the format's range. A block of zeros gets the smallest scale.
    """
    values = blocks.to(torch.float64)
    n = real.sum(dim=-1).to(torch.float64).clamp(min=1)
    if spec.scale_rule == "std":  # two passes: no cancellation for a large mean
        mean = values.sum(dim=-1, keepdim=True) / n.unsqueeze(-1)
        values = torch.where(real, values - mean, torch.zeros_like(values))
    mean_square = values.square().sum(dim=-1) / n
    fit = spec.rms_clip / spec.element_format.max_value
    largest = torch.finfo(torch.float32).max
    raw = (mean_square.sqrt() * fit).clamp(max=largest).to(torch.float32)
    fmt = spec.scale_format
    if fmt.kind == "pow2":
        exponent = floor_log2(torch.where(raw > 0, raw, torch.ones_like(raw)))
        exponent = torch.where(raw > 0, exponent, torch.full_like(exponent, fmt.min_exponent))
        exponent = exponent.clamp(fmt.min_exponent, fmt.max_exponent)
        return pow2(exponent), (exponent + fmt.exponent_bias).to(torch.uint8)
    if fmt.kind == "minifloat":  # any rule but "ceil" rounds to nearest even
        assert fmt.minifloat is not None
        scales = _round_scale_minifloat(raw, fmt.minifloat, spec.scale_rule)
        return scales, encode(scales, fmt.minifloat)
    scales = _round_scale_float(raw, fmt, spec.scale_rule)
    return scales, scales.to(torch.bfloat16) if fmt.dtype_name == "bfloat16" else scales
