"""DGE's factor on the weight gradient (`fp4cli.techniques.dge.dge_derivative`) in two passes
around torch's own `pow`, so that every bit is the reference's:

- `dge_position_kernel`: the scaled weight w / s (s per row, column or tensor), the grid interval
  [lower, lower + width) holding |w / s| (the last one closed) and t = |2 (|w / s| - lower) /
  width - 1|, in the reference's order of float32 operations (its two divisions, by powers of
  two, as multiplications by their exact reciprocals: the same roundings); NaN where |w / s|
  lies beyond the grid (or is NaN), which `pow` keeps NaN.
- the caller raises t to 1 / k - 1 with `torch.pow`, in place;
- `dge_apply_kernel`: the derivative min(t^(1/k - 1) * (1 / k), cap) (0 where NaN; cap where
  t = 0, whose power is +Inf), rounded to the gradient's dtype, multiplied into the gradient in
  place as torch multiplies two tensors of that dtype.

The interval comes from the element format's bits, not a search: its lower end is
floor(|w / s| / spacing) * spacing, its width the spacing of |w / s|'s binade (normals) or of
the smallest normal binade (subnormals).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_ops import pow2
from fp4cli.kernels.vector.vector_wise import expand_line, line_index, line_ok, program_tile


@triton.jit
def grid_position(magnitude, MBITS: tl.constexpr, MIN_EXP: tl.constexpr,
                  ELEM_MAX: tl.constexpr):  # fmt: skip
    """t = |2 (m - lower) / width - 1| of magnitudes m on the element grid; NaN beyond it. At
    the largest value m = lower gives t = 1, as the closed last interval does."""
    exponent = ((magnitude.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    binade = tl.maximum(exponent, MIN_EXP)
    lower = tl.floor(magnitude * pow2(MBITS - binade)) * pow2(binade - MBITS)  # exact
    # over the width, a power of two: times its exact reciprocal, the same rounding
    t = tl.abs(2.0 * (magnitude - lower) * pow2(MBITS - binade) - 1.0)
    return tl.where(magnitude <= ELEM_MAX, t, float("nan"))


@triton.jit
def dge_position_kernel(
    w_ptr, scales_ptr, t_ptr, R, C, tiles_c,
    BR: tl.constexpr, BC: tl.constexpr, BY: tl.constexpr,
    MBITS: tl.constexpr, MIN_EXP: tl.constexpr, ELEM_MAX: tl.constexpr,
):  # fmt: skip
    """t (float32, NaN beyond the grid) of a contiguous (R, C) weight over its float32 scales
    (one per row, column or the tensor: BY as in `vector_wise`)."""
    first_row, first_col, offsets, mask = program_tile(R, C, tiles_c, BR, BC)
    w = tl.load(w_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    index = line_index(first_row, first_col, BR, BC, BY)
    scale = tl.load(scales_ptr + index, mask=line_ok(index, R, C, BY), other=1.0)
    # E8M0 scales are powers of two: 1 / s is exact, and w * (1 / s) rounds as w / s
    inverse = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)  # per line
    magnitude = tl.abs(w * expand_line(inverse, BY))
    t = grid_position(magnitude, MBITS, MIN_EXP, ELEM_MAX)
    tl.store(t_ptr + offsets, t, mask=mask)


@triton.jit
def dge_apply_kernel(
    grad_ptr, power_ptr, R, C, tiles_c, grad_stride_r, grad_stride_c, inv_k, cap,
    BR: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """grad *= min(power * inv_k, cap) (0 where power is NaN), the factor rounded to grad's
    dtype first; grad (R, C) with any strides, power contiguous."""
    first_row, first_col, offsets, mask = program_tile(R, C, tiles_c, BR, BC)
    power = tl.load(power_ptr + offsets, mask=mask, other=0.0)
    factor = tl.where(power != power, 0.0, tl.minimum(power * inv_k, cap))
    dtype = grad_ptr.dtype.element_ty
    factor = factor.to(dtype).to(tl.float32)
    rows = first_row + tl.arange(0, BR)
    cols = first_col + tl.arange(0, BC)
    grad_offsets = rows.to(tl.int64)[:, None] * grad_stride_r + cols[None, :] * grad_stride_c
    grad = tl.load(grad_ptr + grad_offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(grad_ptr + grad_offsets, (grad * factor).to(dtype), mask=mask)
