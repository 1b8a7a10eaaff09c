"""Dequantization's division by the SR pre-scale, as a multiplication where that is exact.

A pre-scaled spec dequantizes as (q * s) / p, correctly rounded (`fp4cli.quant.reference`;
p = sr_prescale, Tseng et al.'s 0.75). On a GPU a correctly rounded division takes a
reciprocal on the special-function unit, Newton steps, a range check and a slow path: several
times a multiplication. Without a tensor scale, q * s takes few values (each grid value times
each scale the scale format encodes), so whether x * fl(1 / p) rounds to the same float32 as
x / p for every one of them can be settled once, in exact rational arithmetic.

`prescale_constants(spec)` gives the kernels PRESCALE (p), PRESCALE_INV (fl(1 / p), or 0.0:
divide) and PRESCALE_FIX / PRESCALE_FIX_RATIO: one magnitude x, a power of two, whose quotient
the multiplication misses, and the factor that gives it exactly (x * ratio = fl(x / p));
PRESCALE_FIX is 0.0 when there is none. With E8M0 scales and p = 0.75 the one exception is
x = 2^-127, whose quotient is subnormal; with more exceptions (UE5M3 scales at 0.75 have 68)
or any that is not a power of two, the kernels divide.
"""

from __future__ import annotations

import functools
from fractions import Fraction

from fp4cli.formats.minifloat import float32
from fp4cli.quant.spec import QuantSpec

FLOAT32_MAX = Fraction((2 - 2**-23) * 2.0**127)
HALF = Fraction(1, 2)


def round_float32(value: Fraction) -> Fraction:
    """The float32 nearest `value`, exactly (ties to the even significand, subnormals); a value
    that rounds past the largest finite float32 comes back as +-2^128, standing for infinity."""
    if value == 0:
        return Fraction(0)
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    ulp = Fraction(2) ** (max(exponent, -126) - 23)
    units, rest = divmod(magnitude, ulp)
    if rest > ulp * HALF or (rest == ulp * HALF and units % 2 == 1):
        units += 1
    rounded = min(units * ulp, Fraction(2) ** 128)  # 2^128: past FLT_MAX, i.e. infinity
    return rounded if value > 0 else -rounded


def _scale_values(spec: QuantSpec) -> list[Fraction] | None:
    """Every finite positive block scale the spec's scale format encodes, or None when the
    scales do not form a small finite set."""
    scale_format = spec.scale_format
    if scale_format.kind == "pow2":
        low, high = scale_format.min_exponent, scale_format.max_exponent
        return [Fraction(2) ** e for e in range(low, high + 1)]
    if scale_format.kind == "minifloat" and scale_format.minifloat is not None:
        mini = scale_format.minifloat
        return [Fraction(mini.decode_magnitude(c)) for c in range(1, mini.max_code + 1)]
    return None


@functools.lru_cache(maxsize=64)
def _multiplication(prescale: float, spec: QuantSpec) -> tuple[float, float, float]:
    """(fl(1 / p), the exception x or 0.0, x's exact factor) when x * fl(1 / p) rounds as
    x / p for every q * s of the spec but at most one x that is a power of two; else zeros."""
    scales = _scale_values(spec)
    if spec.tensor_scale or scales is None:
        return 0.0, 0.0, 0.0
    p = Fraction(float32(prescale))
    inverse = round_float32(1 / p)
    grid = [Fraction(spec.element_format.decode_magnitude(c))
            for c in range(1, spec.element_format.max_code + 1)]  # fmt: skip
    missed = set()
    for q in grid:
        for s in scales:
            x = q * s  # exact in float32: few significant bits
            if x <= FLOAT32_MAX and round_float32(x * inverse) != round_float32(x / p):
                missed.add(x)
    if not missed:
        return float(inverse), 0.0, 0.0
    if len(missed) > 1:
        return 0.0, 0.0, 0.0
    fix = missed.pop()
    if fix.numerator != 1 or fix.denominator & (fix.denominator - 1):
        return 0.0, 0.0, 0.0  # not 2^-k: its factor might not be exact
    ratio = round_float32(fix / p) / fix  # exact: a float32 over a power of two
    return float(inverse), float(fix), float(ratio)


def prescale_constants(spec: QuantSpec) -> dict[str, float]:
    """The kernels' PRESCALE, PRESCALE_INV, PRESCALE_FIX and PRESCALE_FIX_RATIO (above)."""
    prescale = float(spec.sr_prescale)
    inverse, fix, ratio = (0.0, 0.0, 0.0) if prescale == 1.0 else _multiplication(prescale, spec)
    return {"PRESCALE": prescale, "PRESCALE_INV": inverse, "PRESCALE_FIX": fix,
            "PRESCALE_FIX_RATIO": ratio}  # fmt: skip
