"""Small number formats described by their bit layout, and exact rounding onto their grids.

One description covers every element and scale format fp4cli knows: E2M1, E3M0, INT4
(sign-magnitude), E1M2, FP8 E4M3 / E5M2, and the unsigned scale formats UE5M3 / UE4M3. Rounding
is done in float32 arithmetic that is exact for these grids: a value is divided by its grid
spacing (a power of two), split into integer and fraction, and the fraction decides up or down.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def float32(value: float) -> float:
    """`value` rounded to the nearest float32 (ties to even, as torch's cast), on the host;
    beyond float32's range, infinity of its sign."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # rounded past FLT_MAX
        return math.copysign(math.inf, value)


@dataclass(frozen=True)
class Minifloat:
    """A sign-magnitude format with `ebits` exponent and `mbits` mantissa bits.

    `ebits == 0` is an integer format (grid spacing 1). `max_code` is the largest magnitude code
    that holds a finite value: codes above it are NaN/Inf (E4M3: 0x7F is NaN; E5M2: 0x7C is Inf).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max_code: int
    signed: bool = True
    nan_code: int | None = None  # magnitude code used for NaN, if the format has one
    inf_code: int | None = None  # magnitude code of Inf, if the format has one (E5M2)

    @property
    def bits(self) -> int:
        return self.ebits + self.mbits + (1 if self.signed else 0)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal value (also the exponent of subnormal spacing)."""
        return 1 - self.bias

    def decode_magnitude(self, code: int) -> float:
        """The value of a magnitude code (exact, as a Python float)."""
        if self.ebits == 0:
            return float(code)
        exp_field, mant = code >> self.mbits, code & ((1 << self.mbits) - 1)
        if exp_field == 0:
            return mant * 2.0 ** (self.min_exponent - self.mbits)
        return (1 + mant / (1 << self.mbits)) * 2.0 ** (exp_field - self.bias)

    @property
    def max_value(self) -> float:
        return self.decode_magnitude(self.max_code)

    @property
    def min_positive(self) -> float:
        return self.decode_magnitude(1)

    @property
    def max_exponent(self) -> int:
        """floor(log2(max_value)): the OCP scale rule subtracts this from the block's exponent."""
        return math.frexp(self.max_value)[1] - 1


@cache
def magnitude_grid(fmt: Minifloat, device: str = "cpu") -> torch.Tensor:
    """All finite magnitudes of `fmt` in code order (which is increasing order), float32."""
    import torch

    values = [fmt.decode_magnitude(c) for c in range(fmt.max_code + 1)]
    return torch.tensor(values, dtype=torch.float32, device=device)


def grid_interval(magnitude: torch.Tensor, fmt: Minifloat) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid points (lower, upper) with lower <= |x| < upper; both are the largest grid value
    at and beyond it. In `magnitude`'s dtype."""
    import torch

    grid = magnitude_grid(fmt, str(magnitude.device)).to(magnitude.dtype)
    upper_index = torch.searchsorted(grid, magnitude.abs().contiguous(), right=True)
    lower = grid[(upper_index - 1).clamp(0, grid.numel() - 1)]
    upper = grid[upper_index.clamp(max=grid.numel() - 1)]
    return lower, upper


def _grid_spacing(fmt: Minifloat, magnitude: torch.Tensor) -> torch.Tensor:
    """The spacing of `fmt`'s grid at |x| (a power of two in x's dtype), exact: for float32 from
    |x|'s exponent field and the power's bits (much cheaper on the CPU), else via frexp and
    ldexp. Both give round_to_grid the same bits
    (tests/quant/test_formats.py)."""
    import torch

    if fmt.ebits == 0:
        return torch.ones_like(magnitude)
    if magnitude.dtype == torch.float32 and fmt.min_exponent - fmt.mbits >= FLOAT32_MIN_EXPONENT:
        # the exponent field in place: floor(log2 |x|) of a normal |x|, clamped up to
        # min_exponent for zero and subnormals and down to 127 for Inf and NaN (a finite
        # spacing, as frexp's 0 gives); less mbits, the spacing's own bits
        field = magnitude.view(torch.int32) & 0x7F800000
        lowest, highest = (fmt.min_exponent + 127) << 23, 254 << 23
        spacing_bits = torch.clamp(field, min=lowest, max=highest) - (fmt.mbits << 23)
        return spacing_bits.view(torch.float32)
    _, exp = torch.frexp(magnitude)  # magnitude = m * 2^exp, m in [0.5, 1)
    exponent = torch.clamp(exp - 1, min=fmt.min_exponent)  # floor(log2 |x|), clamped to normals
    return torch.ldexp(torch.ones_like(magnitude), exponent - fmt.mbits)


FLOAT32_MIN_EXPONENT = -126  # of float32's smallest normal number


def _code_parity_is_the_counts(fmt: Minifloat) -> bool:
    """Whether a grid point's code ends in the last bit of its count of grid steps in its
    binade: the mantissa's last bit, or the integer's (not E3M0's, the exponent field's)."""
    return fmt.mbits > 0 or fmt.ebits == 0


def _lower_code_is_odd(fmt: Minifloat, floor_units: torch.Tensor, spacing: torch.Tensor):
    """Whether the lower of the two bracketing grid points has an odd code (for ties to even)."""
    import torch

    if _code_parity_is_the_counts(fmt):
        # floor_units is a small whole number wherever a tie can occur (a non-finite one never
        # ties)
        return (floor_units.to(torch.int32) & 1).bool()
    # No mantissa bits (E3M0): the last bit is the exponent field's; zero has code 0.
    _, exp = torch.frexp(spacing)
    exp_field = exp - 1 + fmt.bias
    return (floor_units > 0) & (torch.remainder(exp_field, 2) == 1)


def round_to_grid(
    x: torch.Tensor,
    fmt: Minifloat,
    rounding: str = "rne",
    uniform: torch.Tensor | None = None,
    guide: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round float32 `x` onto `fmt`'s grid, saturating at +-max_value. NaN stays NaN.

    rounding: "rne" (ties to even code), "away" (ties away from zero), "ties_up" (ties toward
    +inf), "up" (away from zero unless on the grid), "sr" (up with probability
    equal to the distance from the lower point, using `uniform` in [0, 1)), "sr_carry"
    (`uniform` times the grid step at |x| added to |x|, then truncated onto the grid: the carry
    rounds up), or "guided" (the one of the two bracketing points nearer `guide`, which must be
    on the same scale as `x`; ties in distance fall back to ties-to-even).
    """
    import torch

    magnitude = x.abs()
    spacing = _grid_spacing(fmt, magnitude)
    if rounding == "sr_carry":
        if uniform is None:
            raise ValueError("stochastic rounding needs uniform random numbers")
        return _carried(x, magnitude + uniform * spacing, fmt)
    units = magnitude / spacing  # exact: division by a power of two
    if rounding == "rne" and _code_parity_is_the_counts(fmt):
        # ties to the even code are ties to the even count: torch.round's rounding, one pass
        rounded = torch.clamp(torch.round(units) * spacing, max=fmt.max_value)
        return torch.copysign(rounded, x)
    floor_units = torch.floor(units)
    frac = units - floor_units  # exact
    if rounding == "rne":
        round_up = (frac > 0.5) | ((frac == 0.5) & _lower_code_is_odd(fmt, floor_units, spacing))
    elif rounding == "away":
        round_up = frac >= 0.5
    elif rounding == "ties_up":  # up in magnitude at a tie only for positive x
        round_up = (frac > 0.5) | ((frac == 0.5) & (x > 0))
    elif rounding == "up":
        round_up = frac > 0
    elif rounding == "sr":
        if uniform is None:
            raise ValueError("stochastic rounding needs uniform random numbers")
        round_up = uniform < frac
    elif rounding == "guided":
        if guide is None:
            raise ValueError("guided rounding needs a guide tensor")
        lower = floor_units * spacing
        upper = lower + spacing
        guide_mag = guide * torch.sign(x)  # the guide on x's side of zero (negative: nearer 0)
        dist_lo, dist_hi = (guide_mag - lower).abs(), (guide_mag - upper).abs()
        ties_even = (frac > 0.5) | ((frac == 0.5) & _lower_code_is_odd(fmt, floor_units, spacing))
        round_up = torch.where(dist_hi == dist_lo, ties_even, dist_hi < dist_lo)
        round_up = round_up & (frac > 0)  # a point on the grid stays where it is
    else:
        raise ValueError(f"unknown rounding {rounding!r}")
    rounded = (floor_units + round_up.to(floor_units.dtype)) * spacing
    rounded = torch.clamp(rounded, max=fmt.max_value)
    return torch.copysign(rounded, x)


def _carried(x: torch.Tensor, total: torch.Tensor, fmt: Minifloat) -> torch.Tensor:
    """|x| plus its random fraction of a step (`total`, rounded once to float32: the product is
    exact) truncated onto the grid in the step at `total`, saturated, with x's sign (a zero
    keeps its own)."""
    import torch

    step = _grid_spacing(fmt, total)
    truncated = torch.clamp(torch.floor(total / step) * step, max=fmt.max_value)
    return torch.copysign(truncated, x)


def encode(values: torch.Tensor, fmt: Minifloat) -> torch.Tensor:
    """Codes (uint8) of values that lie on `fmt`'s grid. NaN gets the format's NaN code (or 0)."""
    import torch

    grid = magnitude_grid(fmt, str(values.device))
    magnitude = values.abs()
    finite = torch.isfinite(values)
    finite_magnitude = torch.where(finite, magnitude, torch.zeros_like(magnitude)).contiguous()
    codes = torch.searchsorted(grid, finite_magnitude)
    codes = codes.clamp(max=fmt.max_code)
    if fmt.signed:
        negative = torch.signbit(values) & (magnitude > 0)
        codes = codes | (negative.to(codes.dtype) * fmt.sign_bit)
    if fmt.nan_code is not None:
        codes = torch.where(finite, codes, torch.full_like(codes, fmt.nan_code))
    return codes.to(torch.uint8)


def decode(codes: torch.Tensor, fmt: Minifloat) -> torch.Tensor:
    """Float32 values of uint8 codes. NaN codes decode to NaN."""
    import torch

    grid = magnitude_grid(fmt, str(codes.device))
    codes = codes.to(torch.int64)
    magnitude_code = codes & (fmt.sign_bit - 1) if fmt.signed else codes
    is_nan = magnitude_code > fmt.max_code
    values = grid[magnitude_code.clamp(max=fmt.max_code)]
    if fmt.inf_code is not None:
        is_inf = magnitude_code == fmt.inf_code
        values = torch.where(is_inf, torch.full_like(values, float("inf")), values)
        is_nan = is_nan & ~is_inf
    if fmt.signed:
        values = torch.where((codes & fmt.sign_bit) != 0, -values, values)
    return torch.where(is_nan, torch.full_like(values, float("nan")), values)
