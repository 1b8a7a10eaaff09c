"""An independent reference for fp4cli's numerics, written from the contract (DESIGN.md,
"Numerics: the contract"; the QuantSpec docstring; the quant/reference.py module docstring), not
from the implementation. It uses numpy and plain Python only: no fp4cli code. Its grids are in
tests/oracle_grids.py, its block scales in tests/oracle_scales.py.

How it differs in method from fp4cli (on purpose, so that the two do not share mistakes):
  * element grids are literal tables (4-bit formats) or enumerated from the bit layout (FP8),
    and a value is rounded by looking at all grid points (nearest, ties to the even code);
  * power-of-two block scales are found with exact rational arithmetic (fractions.Fraction);
  * blocks are never padded: every element gets a block id, and padding zeros are irrelevant
    to amax;
  * the stochastic-rounding bits come from a separate Philox4x32-10 written from Random123
    (tests/oracle_philox.py).

Where float32 rounding is part of the contract (quant/reference.py: "in float32"), the oracle
mirrors the exact float32 operation order with numpy float32 scalars/arrays. Each such place is
marked "FP32 MIRROR". They are:
  1. two-level (docs/numerics.md, TransformerEngine's NVFP4 order): with A the amax over finite
     values, G = min(fp32(scale_max * elem_max) / A, FP32_MAX), D = 1 / G; a block of amax a
     gets raw = min(a * (G * fp32(1 / elem_max)), scale_max) rounded onto the scale grid (0
     allowed), encodes as x * min(1 / (s * D), FP32_MAX) and decodes as
     q * ((s * A) * fp32(1 / (scale_max * elem_max))); with outer_block, A is the amax of the
     outer_block values of the line (from position 0) that hold the block;
  2. non power-of-two block scales: raw = fp32(amax) / fp32(elem_max), then raw is rounded onto
     the scale grid (ue5m3/ue4m3: enumeration; bf16: by its bit layout; fp32: raw itself);
  3. v = fp32(x / s), then v * sr_prescale;
  4. dequantization (q * s) / sr_prescale.
Power-of-two scales make 3 and 4 exact, so there the mirror changes nothing.

MS-EDEN (rounding "eden", from the QuantSpec docstring and Quartet II's released code): the
elements are rounded to nearest with ties away from zero; per group of eden_group / block
consecutive blocks along a line, c = sum(v^2) / sum(v * q) over the group's blocks whose scale
is not 0 (v: the pre-scaled grid values of step 3, q their rounded values; c = 1 when the
denominator is 0), each term truncated to a multiple of 2^-16 and summed exactly (integers
here), the ratio of the two sums rounded to float64, then to float32; each such
block's scale becomes the float32 product s * c rounded stochastically onto the scale grid with
the uniform number of the block's first element (its smallest index in x). The tensor scale
then targets 256 (E4M3) as with four-over-six.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from tests.oracle_grids import ELEMENT_MAX, GRIDS, SCALE_GRIDS, round_to_grid
from tests.oracle_philox import sr_uniform
from tests.oracle_scales import (
    F32,
    FP32_MAX,
    _round_scale_grid,
    block_scale,
    fitted_scales,
    scale_max,
)

# --------------------------------------------------------------------------------------------
# The whole quantizer
# --------------------------------------------------------------------------------------------


@dataclass
class Reference:
    """out: dequantized float32 in x's shape. q: element values (float64, NaN in non-finite
    blocks) in the moved (axis-last, unpadded) layout. scales: float32 block scales (NaN for
    non-finite blocks) shaped like fp4cli's scale tensor. tensor_amax: a two-level spec's amax
    over finite values, or None."""

    out: np.ndarray
    q: np.ndarray
    scales: np.ndarray
    tensor_amax: float | None


def _block_ids(shape: tuple[int, ...], spec: Any) -> tuple[np.ndarray, tuple[int, ...]]:
    """Block id of every element of the moved (axis-last) tensor, and the scales' shape."""
    length = shape[-1]
    lead = shape[:-1]
    position = np.broadcast_to(np.arange(length), shape)
    lead_index = np.arange(int(np.prod(lead, dtype=np.int64))).reshape(*lead, 1)
    if spec.tile2d:
        if len(shape) != 2:
            raise ValueError("tile2d needs 2-D")
        b = int(spec.block)
        rows = np.arange(shape[0]).reshape(-1, 1) // b
        n_cols = -(-length // b)
        return rows * n_cols + position // b, (-(-shape[0] // b), n_cols)
    if spec.block == "row":
        return np.broadcast_to(lead_index, shape), (*lead, 1)
    if spec.block == "tensor":
        return np.zeros(shape, dtype=np.int64), (1,)
    if spec.block == "column":  # one block per position along the axis
        return position, (length,)
    b = int(spec.block)
    n_blocks = -(-length // b)
    return lead_index * n_blocks + position // b, (*lead, n_blocks)


def reference(x: np.ndarray, spec: Any, axis: int = -1, seed: int | None = None) -> Reference:
    """Quantize-dequantize float32 `x` along `axis` by the contract."""
    x = np.asarray(x, dtype=np.float32)
    axis = axis % x.ndim
    moved = np.moveaxis(x, axis, -1)
    ids, scale_shape = _block_ids(moved.shape, spec)
    ids = np.ascontiguousarray(ids).reshape(-1)
    flat = np.ascontiguousarray(moved).reshape(-1)
    n_blocks = int(np.prod(scale_shape))

    finite = np.isfinite(flat)
    bad_block = np.zeros(n_blocks, dtype=bool)
    np.logical_or.at(bad_block, ids, ~finite)
    clean = np.where(finite, flat, F32(0)).astype(np.float32)

    tensor_amax = None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        amax = np.zeros(n_blocks, dtype=np.float32)
        np.maximum.at(amax, ids, np.abs(clean))
        if spec.tensor_scale:
            tensor_amax = _second_level_amax(clean, ids, amax, moved.shape, spec)
        uniform = None
        eden = spec.rounding == "eden"
        if spec.rounding in ("sr", "eden"):
            if seed is None:
                raise ValueError("the oracle needs an explicit seed for sr")
            index = np.moveaxis(np.arange(x.size).reshape(x.shape), axis, -1).reshape(-1)
            uniform = sr_uniform(seed, index)
            if eden:  # one number per block: that of its first element
                first = np.full(n_blocks, np.iinfo(np.int64).max, dtype=np.int64)
                np.minimum.at(first, ids, index.astype(np.int64))
                uniform = sr_uniform(seed, first)
        fitted = None
        if getattr(spec, "scale_rule", "floor") in ("rms", "std"):
            fitted = fitted_scales(clean, ids, n_blocks, spec)
        q, out, scales = _candidate(
            clean, ids, amax, tensor_amax, spec, None if eden else uniform, fitted=fitted
        )
        if eden:
            assert tensor_amax is not None and uniform is not None
            out, scales = _eden(clean, q, ids, amax, tensor_amax, spec, uniform, scale_shape)
        if getattr(spec, "four_over_six", False):
            q4, out4, scales4 = _candidate(clean, ids, amax, tensor_amax, spec, uniform, 4.0)
            four = _nearer(clean, out4, out, ids, amax)
            q, out = np.where(four[ids], q4, q), np.where(four[ids], out4, out)
            scales = np.where(four, scales4, scales)

    bad = bad_block[ids]
    out = np.where(bad, np.float32(np.nan), out)
    q = np.where(bad, np.nan, q)
    scales = np.where(bad_block, np.float32(np.nan), scales)
    out_moved = out.reshape(moved.shape)
    return Reference(
        out=np.ascontiguousarray(np.moveaxis(out_moved, -1, axis)),
        q=q.reshape(moved.shape),
        scales=scales.reshape(scale_shape),
        tensor_amax=None if tensor_amax is None or np.ndim(tensor_amax) else float(tensor_amax),
    )


def _second_level_amax(
    clean: np.ndarray, ids: np.ndarray, amax: np.ndarray, shape: tuple[int, ...], spec: Any
) -> Any:
    """The amax the FP32 second-level scale derives from: the tensor's (a float32 scalar), or
    with outer_block, per block the amax of the outer_block values of its line that hold it
    (outer block j of a line: positions j * outer_block .. (j + 1) * outer_block - 1)."""
    outer = getattr(spec, "outer_block", 0)
    if not outer:
        return F32(np.abs(clean).max())
    lines = int(np.prod(shape[:-1], dtype=np.int64))
    outer_of_position = np.arange(shape[-1]) // outer
    n_outer = -(-shape[-1] // outer)
    outer_ids = (np.arange(lines).reshape(-1, 1) * n_outer + outer_of_position).reshape(-1)
    outer_amax = np.zeros(lines * n_outer, dtype=np.float32)
    np.maximum.at(outer_amax, outer_ids, np.abs(clean))
    block_outer = np.empty(amax.size, dtype=np.int64)
    block_outer[ids] = outer_ids
    return outer_amax[block_outer]


def _two_level(
    block_amax: np.ndarray, tensor_amax: np.float32, spec: Any, elem_max: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FP32 MIRROR (1): (block scales, encode multipliers, decode factors), float32. With
    four-over-six the tensor scale targets 256 (E4M3), the largest power of two at most
    448 / 1.5, and `elem_max` 4 is the block's other candidate."""
    largest = scale_max(spec)
    if getattr(spec, "four_over_six", False) or spec.rounding == "eden":
        largest = 2.0 ** math.floor(math.log2(largest / 1.5))
    target = F32(largest * ELEMENT_MAX[spec.element])
    grid = SCALE_GRIDS[spec.scale]
    mode = "up" if spec.scale_rule == "ceil" else "rne"
    scales = np.empty_like(block_amax)
    encode = np.empty_like(block_amax)
    decode = np.empty_like(block_amax)
    per_block = np.ndim(tensor_amax) > 0  # outer_block: each block's own second-level amax
    for i, a in enumerate(block_amax.tolist()):
        t = F32(tensor_amax[i]) if per_block else tensor_amax
        g = min(F32(target / t) if t > 0 else F32(np.inf), F32(FP32_MAX))
        d = F32(F32(1.0) / g)
        multiplier = F32(g * F32(1.0 / (elem_max or ELEMENT_MAX[spec.element])))
        raw = min(min(F32(F32(a) * multiplier), F32(FP32_MAX)), F32(grid.max_value))
        s = F32(_round_scale_grid(float(raw), grid, mode))
        scales[i] = s
        product = F32(s * d)
        encode[i] = min(F32(F32(1.0) / product) if product > 0 else F32(np.inf), F32(FP32_MAX))
        decode[i] = F32(F32(s * t) * F32(1.0 / target))
    return scales, encode, decode


def _candidate(
    clean: np.ndarray,
    ids: np.ndarray,
    amax: np.ndarray,
    tensor_amax: np.float32 | None,
    spec: Any,
    uniform: np.ndarray | None,
    elem_max: float | None = None,
    fitted: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, decoded values, block scales) with each block's amax scaled onto the element max
    (or `elem_max`: four-over-six's 4), or the `fitted` scales."""
    if tensor_amax is not None:
        scales, multipliers, decode = _two_level(amax, tensor_amax, spec, elem_max)
        v = (clean * multipliers[ids]).astype(np.float32)  # FP32 MIRROR (1)
    else:
        cache_: dict[float, float] = {}
        scales64 = fitted
        if scales64 is None:
            scales64 = np.array(
                [cache_.setdefault(a, block_scale(a, spec, elem_max)) for a in amax.tolist()]
            )
        scales = scales64.astype(np.float32)
        assert np.array_equal(scales.astype(np.float64), scales64), "scale not a float32"
        decode = scales
        v = (clean / scales[ids]).astype(np.float32)  # FP32 MIRROR (3)
    if spec.sr_prescale != 1.0:
        v = (v * F32(spec.sr_prescale)).astype(np.float32)
    mode = "away" if spec.rounding == "eden" else spec.rounding
    q = round_to_grid(v.astype(np.float64), GRIDS[spec.element], mode, uniform)
    out = (q.astype(np.float32) * decode[ids]).astype(np.float32)  # FP32 MIRROR (1, 4)
    if spec.sr_prescale != 1.0:
        out = (out / F32(spec.sr_prescale)).astype(np.float32)
    return q, out, scales


def _eden(
    clean: np.ndarray,
    q: np.ndarray,
    ids: np.ndarray,
    amax: np.ndarray,
    tensor_amax: np.float32,
    spec: Any,
    uniform: np.ndarray,
    scale_shape: tuple[int, ...],
) -> tuple[np.ndarray, np.ndarray]:
    """MS-EDEN: (decoded values, block scales) after each group's correction."""
    scales, multipliers, _ = _two_level(amax, tensor_amax, spec)
    v = (clean * multipliers[ids]).astype(np.float32)
    if spec.sr_prescale != 1.0:
        v = (v * F32(spec.sr_prescale)).astype(np.float32)
    per_line = scale_shape[-1]
    k = spec.eden_group // int(spec.block)
    groups = (ids // per_line) * -(-per_line // k) + (ids % per_line) // k
    num: dict[int, Fraction] = {}
    den: dict[int, Fraction] = {}
    for i, block in enumerate(ids.tolist()):
        if scales[block] == 0:
            continue
        u, g = Fraction(float(v[i])), int(groups[i])
        num[g] = num.get(g, Fraction(0)) + math.floor(u * u * 2**16)
        den[g] = den.get(g, Fraction(0)) + math.floor(abs(u * Fraction(float(q[i]))) * 2**16)
    corrected = scales.copy()
    block_group = (np.arange(scales.size) // per_line) * -(-per_line // k) + (
        np.arange(scales.size) % per_line
    ) // k
    for block in range(scales.size):
        g = int(block_group[block])
        if scales[block] == 0:
            continue
        c = F32(float(num[g]) / float(den[g])) if den.get(g, 0) != 0 else F32(1.0)
        product = F32(scales[block] * c)
        grid = SCALE_GRIDS[spec.scale]
        corrected[block] = F32(round_to_grid(np.array([product]), grid, "sr", uniform[block])[0])
    target = F32(2.0 ** math.floor(math.log2(scale_max(spec) / 1.5)) * ELEMENT_MAX[spec.element])
    decode = (F32(1.0 / target) * (corrected * tensor_amax).astype(np.float32)).astype(np.float32)
    out = (q.astype(np.float32) * decode[ids]).astype(np.float32)
    if spec.sr_prescale != 1.0:
        out = (out / F32(spec.sr_prescale)).astype(np.float32)
    return out, corrected


def _nearer(
    clean: np.ndarray,
    out_four: np.ndarray,
    out_six: np.ndarray,
    ids: np.ndarray,
    amax: np.ndarray,
) -> np.ndarray:
    """Per block: whether the candidate scaled to 4 is strictly nearer, by four-over-six's
    integer error (`fp4cli.quant.four_over_six`), term by term in Python floats and ints."""
    error_four = [0] * len(amax)
    error_six = [0] * len(amax)
    for i, block in enumerate(ids.tolist()):
        unit = _error_unit(float(amax[block]))
        error_four[block] += _error_term(float(out_four[i]), float(clean[i]), unit)
        error_six[block] += _error_term(float(out_six[i]), float(clean[i]), unit)
    return np.array([f < s for f, s in zip(error_four, error_six, strict=True)])


def _error_unit(amax: float) -> float:
    """2^(24 - E), E the smallest integer with amax < 2^E, at least -125 (subnormals, 0)."""
    exponent = -125 if amax < 2.0**-126 else math.frexp(amax)[1]
    return 2.0 ** (24 - exponent)


def _error_term(decoded: float, x: float, unit: float) -> float:
    """trunc(min(((decoded - x) * unit)^2, 2^54)); a non-finite decoded value makes its block's
    error infinite (a float inf, larger than every int sum)."""
    if not math.isfinite(decoded):
        return math.inf
    scaled = (decoded - x) * unit
    return math.trunc(min(scaled * scaled, 2.0**54))
