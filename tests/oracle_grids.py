"""The oracle's element and scale grids (tests/oracle.py): literal tables for the 4-bit formats,
FP8 grids enumerated from their bit layout, and rounding by looking at every grid point (nearest,
ties to the even code). numpy and plain Python only: no fp4cli code."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

# --------------------------------------------------------------------------------------------
# Element grids
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """The finite non-negative values of a signed format, with their magnitude codes."""

    name: str
    codes: tuple[int, ...]  # magnitude codes, ascending value order
    values: tuple[float, ...]  # float64, exact
    sign_bit: int  # 1 << (ebits + mbits)

    @property
    def max_value(self) -> float:
        return max(self.values)

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.values, dtype=np.float64)

    def value_of_code(self, code: int) -> float:
        """Signed value of a full code (sign bit included); codes outside the table raise."""
        magnitude = self.values[self.codes.index(code & (self.sign_bit - 1))]
        return -magnitude if code & self.sign_bit else magnitude


def _fp8_grid(name: str, ebits: int, mbits: int, bias: int, max_code: int) -> Grid:
    values = []
    for code in range(max_code + 1):
        exp, man = code >> mbits, code & ((1 << mbits) - 1)
        if exp == 0:
            values.append(man / 2**mbits * 2.0 ** (1 - bias))
        else:
            values.append((1 + man / 2**mbits) * 2.0 ** (exp - bias))
    return Grid(name, tuple(range(max_code + 1)), tuple(values), 1 << (ebits + mbits))


GRIDS: dict[str, Grid] = {
    # code = sign<<3 | exponent<<1 | mantissa
    "e2m1": Grid("e2m1", tuple(range(8)), (0, 0.5, 1, 1.5, 2, 3, 4, 6), 8),
    # no mantissa: code = sign<<3 | exponent, bias 3, exponent 0 is zero
    "e3m0": Grid("e3m0", tuple(range(8)), (0, 0.25, 0.5, 1, 2, 4, 8, 16), 8),
    # sign-magnitude integers
    "int4": Grid("int4", tuple(range(8)), (0, 1, 2, 3, 4, 5, 6, 7), 8),
    "e4m3": _fp8_grid("e4m3", 4, 3, 7, 0x7E),  # 0x7F is NaN, max 448
    "e5m2": _fp8_grid("e5m2", 5, 2, 15, 0x7B),  # 0x7C Inf, above NaN, max 57344
}
ELEMENT_MAX = {"e2m1": 6.0, "e3m0": 16.0, "int4": 7.0, "e4m3": 448.0, "e5m2": 57344.0}

# Unsigned scale grids (UE5M3: exponent field 31 reserved; UE4M3: 0x7F is NaN).
SCALE_GRIDS: dict[str, Grid] = {
    "ue5m3": _fp8_grid("ue5m3", 5, 3, 15, (30 << 3) | 7),
    "ue4m3": _fp8_grid("ue4m3", 4, 3, 7, 0x7E),
}


def round_to_grid(
    v: np.ndarray, grid: Grid, mode: str, uniform: np.ndarray | None = None
) -> np.ndarray:
    """Round finite float64 values onto `grid` by enumeration, saturating to +-max.

    rne: nearest, ties to the point whose code is even. away: ties away from zero. ties_up:
    ties toward +inf (the larger magnitude for a positive value, the smaller for a negative).
    sr: the two bracketing points lo <= |v| <= hi; up with probability (|v|-lo)/(hi-lo), i.e.
    when uniform < (|v|-lo)/(hi-lo).
    """
    v = np.asarray(v, dtype=np.float64)
    flat = v.reshape(-1)
    out = np.empty_like(flat)
    table = grid.array
    even = (np.asarray(grid.codes) % 2) == 0
    u_flat = None if uniform is None else np.asarray(uniform, dtype=np.float64).reshape(-1)
    chunk = 4096
    for start in range(0, flat.size, chunk):
        part = flat[start : start + chunk]
        mag = np.minimum(np.abs(part), grid.max_value)  # saturate
        dist = np.abs(mag[:, None] - table[None, :])
        if mode in ("rne", "away", "ties_up"):
            nearest = dist == dist.min(axis=1, keepdims=True)  # one point, or two on a tie
            larger = table.size - 1 - np.argmax(nearest[:, ::-1], axis=1)
            if mode == "ties_up":  # the larger magnitude for x > 0, the smaller for x < 0
                index = np.where(part > 0, larger, np.argmax(nearest, axis=1))
            elif mode == "rne":
                pick_even = nearest & even[None, :]
                choice = np.where(pick_even.any(axis=1, keepdims=True), pick_even, nearest)
                # exactly one even code among two neighbours, so one point is left
                index = np.argmax(choice, axis=1)
            else:
                index = larger
            rounded = table[index]
        elif mode == "sr":
            assert u_flat is not None
            u = u_flat[start : start + chunk]
            below = np.where(table[None, :] <= mag[:, None], table[None, :], -np.inf).max(axis=1)
            above = np.where(table[None, :] >= mag[:, None], table[None, :], np.inf).min(axis=1)
            width = np.where(above > below, above - below, 1.0)
            prob_up = (mag - below) / width
            rounded = np.where(u < prob_up, above, below)
        else:
            raise ValueError(mode)
        out[start : start + chunk] = np.copysign(rounded, part)
    return out.reshape(v.shape)


def grid_floor_ceil(v: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """The bracketing grid points (signed, toward zero and away from zero) of values within
    +-max."""
    mag = np.abs(np.asarray(v, dtype=np.float64))
    table = grid.array
    below = np.where(table[None, :] <= mag.reshape(-1, 1), table[None, :], -np.inf).max(axis=1)
    above = np.where(table[None, :] >= mag.reshape(-1, 1), table[None, :], np.inf).min(axis=1)
    sign = np.where(np.signbit(v), -1.0, 1.0).reshape(-1)
    return (sign * below).reshape(np.shape(v)), (sign * above).reshape(np.shape(v))


@cache
def code_table(element: str) -> dict[int, float]:
    """Full code -> value table of a signed element format (finite codes only)."""
    grid = GRIDS[element]
    table = {}
    for code, value in zip(grid.codes, grid.values, strict=True):
        table[code] = float(value)
        table[code | grid.sign_bit] = -float(value)
    return table
