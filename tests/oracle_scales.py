"""The oracle's block scales (tests/oracle.py): power-of-two exponents in exact rational
arithmetic, minifloat and bf16 scales by their bit layout, and the fitted (RMS, std) rules.
numpy and plain Python only: no fp4cli code."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from tests.oracle_grids import ELEMENT_MAX, SCALE_GRIDS, Grid, round_to_grid

F32 = np.float32
FP32_MAX = float(np.finfo(np.float32).max)
BF16_MAX = (2 - 2**-7) * 2.0**127

# --------------------------------------------------------------------------------------------
# Block scales
# --------------------------------------------------------------------------------------------


def floor_log2(value: Fraction) -> int:
    """floor(log2 value) for a positive rational, exactly."""
    n, d = value.numerator, value.denominator
    e = n.bit_length() - d.bit_length()
    # 2^e <= n/d < 2^(e+1) ?
    while Fraction(2) ** e > value:
        e -= 1
    while Fraction(2) ** (e + 1) <= value:
        e += 1
    return e


def e8m0_exponent(amax: float, elem_max: float, rule: str) -> int:
    """The E8M0 exponent of a block with finite amax (a float32 value), clamped to
    [-127, 127]."""
    if amax == 0:
        return -127
    a, m = Fraction(amax), Fraction(elem_max)
    if rule == "floor":
        e = floor_log2(a) - floor_log2(m)
    else:  # ceil(log2(amax / emax)): the smallest e with amax <= emax * 2^e
        ratio = a / m
        e = floor_log2(ratio)
        if Fraction(2) ** e < ratio:
            e += 1
    return max(-127, min(127, e))


def _round_binary(value: float, mbits: int, emin: int, mode: str) -> float:
    """Round a non-negative float64 onto a binary float grid with `mbits` mantissa bits and
    minimum normal exponent `emin` (subnormals below), unbounded above. rne or up."""
    if value == 0:
        return 0.0
    r = Fraction(value)
    e = max(floor_log2(r), emin)
    ulp = Fraction(2) ** (e - mbits)
    units = r / ulp
    whole = math.floor(units)
    frac = units - whole
    if mode == "rne":
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and whole % 2 == 1)
    else:
        up = frac > 0
    return float((whole + up) * ulp)


def _round_scale_grid(raw: float, grid: Grid, mode: str) -> float:
    """raw (>= 0) onto an unsigned scale grid by enumeration: rne (ties to even code) or up."""
    if mode == "rne":
        return float(round_to_grid(np.array([raw]), grid, "rne")[0])
    table = grid.array
    above = table[table >= raw]
    return float(above.min()) if above.size else grid.max_value


def block_scale(amax: float, spec: Any, elem_max: float | None = None) -> float:
    """The scale of one block with finite amax (float32 value), mapping it onto the element
    format's largest value (or `elem_max`)."""
    elem_max = elem_max or ELEMENT_MAX[spec.element]
    if spec.scale == "e8m0":
        return 2.0 ** e8m0_exponent(amax, elem_max, spec.scale_rule)
    # FP32 MIRROR (2): the quotient is a float32 division, then rounded onto the scale grid.
    raw = float(F32(amax) / F32(elem_max))
    mode = "up" if spec.scale_rule == "ceil" else "rne"
    if spec.scale in SCALE_GRIDS:
        grid = SCALE_GRIDS[spec.scale]
        lo, hi = grid.values[1], grid.max_value
        s = _round_scale_grid(raw, grid, mode)
    elif spec.scale == "bf16":
        lo, hi = 2.0**-133, BF16_MAX
        s = _round_binary(raw, 7, -126, mode)
    elif spec.scale == "fp32":
        # raw is already a float32: rounding it (either way) onto the fp32 grid leaves it.
        lo, hi = 2.0**-149, FP32_MAX
        s = raw
    else:
        raise ValueError(spec.scale)
    return min(max(s, lo), hi)


def fitted_scales(clean: np.ndarray, ids: np.ndarray, n_blocks: int, spec: Any) -> np.ndarray:
    """The scale rules "rms" and "std" (QuEST's Gaussian fit, from the QuantSpec docstring):
    s = rms_clip / elem_max * sqrt(m), m the mean of x^2 over the block's own values (std: less
    the squared mean), the moments exact (fractions), the root and the product in float64,
    then float32; onto the format: e8m0 the largest power of two at most s, grids and bf16 to
    nearest even, fp32 s; clamped to the format's range (a zero block: its smallest scale)."""
    sums, squares = [Fraction(0)] * n_blocks, [Fraction(0)] * n_blocks
    counts = [0] * n_blocks
    for i, value in zip(ids.tolist(), clean.tolist(), strict=True):
        f = Fraction(value)
        sums[i] += f
        squares[i] += f * f
        counts[i] += 1
    fit = spec.rms_clip / ELEMENT_MAX[spec.element]
    scales = []
    for total, square, n in zip(sums, squares, counts, strict=True):
        n = max(n, 1)
        m = square / n - ((total / n) ** 2 if spec.scale_rule == "std" else 0)
        raw = float(F32(min(math.sqrt(float(m)) * fit, FP32_MAX)))
        if spec.scale == "e8m0":
            e = floor_log2(Fraction(raw)) if raw > 0 else -127
            scales.append(2.0 ** max(-127, min(127, e)))
        elif spec.scale in SCALE_GRIDS:
            grid = SCALE_GRIDS[spec.scale]
            s = _round_scale_grid(raw, grid, "rne")
            scales.append(min(max(s, grid.values[1]), grid.max_value))
        elif spec.scale == "bf16":
            scales.append(min(max(_round_binary(raw, 7, -126, "rne"), 2.0**-133), BF16_MAX))
        else:
            scales.append(max(raw, 2.0**-149))
    return np.asarray(scales, dtype=np.float64)


def scale_max(spec: Any) -> float:
    return {"ue5m3": 61440.0, "ue4m3": 448.0}[spec.scale]
