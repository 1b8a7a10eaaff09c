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
x = 2^-127, whose quotient is subnormal.

With a tensor scale q * s takes any float32 value, and the multiplication alone misses (for
Quartet II's p = 16 / (17 * 0.93), a fifth of all significands). There PRESCALE_REMAINDER
takes one remainder step: y = x * fl(1 / p), r = fma(y, p, -x) (exact: y is within an ulp of
x / p), then fma(-r, fl(1 / p), y). Whether that is x / p correctly rounded for every x is
settled once per p over every float32 significand (`remainder_misses`, exact): scaling x by a
power of two scales y, r and the result alike while all of them stay normal, which holds for
|x| in [2^-90, 2^90] when p is in [1/16, 16]. The kernels take the step on a tile whose block
scales keep every nonzero |q * s| there (`REMAINDER_SCALES`, with |q| in [1/8, 8]) and divide on
any other tile. The interpreter's fma rounds twice, so under it the kernels divide. Any spec
neither method covers (UE5M3 scales at 0.75 have 68 exceptions to the multiplication) divides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from fp4cli.formats.minifloat import float32
from fp4cli.quant.backend import interpreter_on
from fp4cli.quant.spec import QuantSpec

FLOAT32_MAX = Fraction((2 - 2**-23) * 2.0**127)
HALF = Fraction(1, 2)
REMAINDER_PRESCALES = (1 / 16, 16.0)  # p where the scaling argument above holds
REMAINDER_SCALES = (2.0**-86, 2.0**86)  # block scales whose nonzero q * s it covers
REMAINDER_GRID = (1 / 8, 8.0)  # nonzero grid magnitudes those scale bounds assume


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


def _grid_magnitudes(spec: QuantSpec) -> list[float]:
    """The element format's nonzero magnitudes, exactly."""
    element = spec.element_format
    return [element.decode_magnitude(c) for c in range(1, element.max_code + 1)]


def _inverse(prescale: float) -> Fraction:
    """fl(1 / p) for the float32 p the kernels hold, exactly."""
    return round_float32(1 / Fraction(float32(prescale)))


@functools.lru_cache(maxsize=64)
def _multiplication(prescale: float, spec: QuantSpec) -> tuple[float, float, float]:
    """(fl(1 / p), the exception x or 0.0, x's exact factor) when x * fl(1 / p) rounds as
    x / p for every q * s of the spec but at most one x that is a power of two; else zeros."""
    scales = _scale_values(spec)
    if spec.tensor_scale or scales is None:
        return 0.0, 0.0, 0.0
    p = Fraction(float32(prescale))
    inverse = _inverse(prescale)
    grid = [Fraction(q) for q in _grid_magnitudes(spec)]
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


def _float32_nearest(values: np.ndarray, exact: Callable[[int], Fraction]) -> np.ndarray:
    """float32 rounding of exact values known as float64 `values` within half a float64 ulp;
    where that half ulp straddles a float32 rounding boundary, of exact(i) for those i."""
    low = np.nextafter(values, -np.inf).astype(np.float32)
    high = np.nextafter(values, np.inf).astype(np.float32)
    rounded = values.astype(np.float32)
    for i in np.flatnonzero(low != high):
        rounded[i] = np.float32(float(round_float32(exact(int(i)))))
    return rounded


@functools.lru_cache(maxsize=8)
def remainder_misses(prescale: float, corrected: bool = True) -> int:
    """How many float32 x in [1, 2) (all 2^23) the remainder step (above; `corrected=False`: the
    multiplication x * fl(1 / p) alone) fails to round as x / p, settled exactly. Every product
    of two float32 fits float64's 53 bits; the two sums that may not are rounded to float32
    through `_float32_nearest`."""
    p = Fraction(float32(prescale))
    inverse = _inverse(prescale)
    p64, inverse64 = float(p), float(inverse)
    x = (np.arange(1 << 23, dtype=np.int32) + (127 << 23)).view(np.float32).astype(np.float64)
    quotient = _float32_nearest(x / p64, lambda i: Fraction(float(x[i])) / p)
    y = (x * inverse64).astype(np.float32).astype(np.float64)  # x * inverse: exact in float64
    if not corrected:
        return int(np.count_nonzero(y != quotient))
    product = y * p64  # exact
    remainder = product - x
    if np.any((product - remainder) != x):  # not exact in float64: the check does not apply
        raise ArithmeticError(f"remainder of x / {p64!r} past float64")
    r = remainder.astype(np.float32).astype(np.float64)  # the fma's one rounding
    step = _float32_nearest(
        y - r * inverse64, lambda i: Fraction(float(y[i])) - Fraction(float(r[i])) * inverse
    )
    return int(np.count_nonzero(step != quotient))


@functools.lru_cache(maxsize=64)
def _remainder_covers(prescale: float, spec: QuantSpec) -> bool:
    """Whether the kernels may take the remainder step for this spec (module docstring)."""
    low, high = REMAINDER_PRESCALES
    grid = _grid_magnitudes(spec)
    return (
        low <= prescale <= high
        and REMAINDER_GRID[0] <= min(grid)
        and max(grid) <= REMAINDER_GRID[1]
        and remainder_misses(prescale) == 0
    )


def prescale_constants(spec: QuantSpec) -> dict[str, float | bool]:
    """The kernels' PRESCALE, PRESCALE_INV, PRESCALE_FIX, PRESCALE_FIX_RATIO and
    PRESCALE_REMAINDER (above); with PRESCALE_REMAINDER, PRESCALE_INV is fl(1 / p)."""
    prescale = float(spec.sr_prescale)
    inverse, fix, ratio = (0.0, 0.0, 0.0) if prescale == 1.0 else _multiplication(prescale, spec)
    remainder = (
        prescale != 1.0 and inverse == 0.0 and not interpreter_on()
        and _remainder_covers(prescale, spec)
    )  # fmt: skip
    if remainder:
        inverse = float(_inverse(prescale))
    return {"PRESCALE": prescale, "PRESCALE_INV": inverse, "PRESCALE_FIX": fix,
            "PRESCALE_FIX_RATIO": ratio, "PRESCALE_REMAINDER": remainder}  # fmt: skip
