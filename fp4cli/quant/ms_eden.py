"""MS-EDEN (Quartet II, arXiv 2601.22813, and its released code, github.com/IST-DASLab/Quartet-II):
an NVFP4 quantizer that is unbiased on average over the random Hadamard transform before it.

Quartet II's backward pass rotates each operand with a random Hadamard transform, then, per
block of the two-level NVFP4 layout, scales and rounds its elements to nearest (ties away from
zero). EDEN's correction then rescales rather than re-rounds: over a group of `eden_group`
values (the transform's size, 128 in the released kernels), with u the values in grid units
(x times the block's encode multiplier, times the pre-scale) and q their rounded values,

    c = sum(u * u) / sum(u * q)          (1 when the sum(u * q) is 0: an all-zero group)

multiplies each of the group's block scales, and the corrected scale s * c (a float32 product)
is rounded stochastically onto the scale format: up with probability its distance from the
lower neighbour over the gap, so that its mean is s * c. The "MS" (micro-scale) part: the
correction lives in the FP8 block scales, no extra storage. Per group, in grid units, the mean
of sum(u * q * s' / s) is then sum(u * u): the quantized group keeps the length of its
projection on the source, which a random rotation turns into an unbiased estimate.

The sums are exact and need no order: each term u * u and u * q (exact in float64) is
truncated to a multiple of 2^-16 (`SUM_UNIT`) and summed as an int64; the ratio of the two
sums is taken in float64 (both exact there: |u| stays under 2^5, a group under 2^10 values)
and rounded to float32. The truncations (each below 2^-16, of terms up to 36) add to at most
the error of float32 sums of 128 such terms, the released kernels' arithmetic, and the unit
of 2^-16 lets a kernel sum a block's terms in 32 bits. A kernel summing in its own order gets
the same bits (as four-over-six's errors, `fp4cli.quant.four_over_six`). A block whose scale
rounded to 0 (an amax below 2^-18 of the tensor's) decodes to 0 whatever its elements: it is
left out of the sums and keeps scale 0. The tensor scale leaves room for the correction to
raise a scale: it targets 256 instead of E4M3's 448 (`fp4cli.quant.two_level.scale_max`), as
the released kernels do. The uniform number of a block's scale comes from the seed and the
index (in the quantized tensor, row-major) of the block's first element.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp4cli.formats import encode, round_to_grid
from fp4cli.quant import two_level
from fp4cli.quant.spec import QuantSpec

SUM_UNIT = 2.0**16  # the sums' terms in units of 2^-16


def fixed_point_terms(products: torch.Tensor) -> torch.Tensor:
    """Non-negative float64 products, exact, truncated to multiples of 2^-16, as int64
    counts of 2^-16."""
    return (products * SUM_UNIT).to(torch.int64)


def group_corrections(
    units: torch.Tensor, q: torch.Tensor, usable: torch.Tensor, group_blocks: int
):
    """c per block (float32, (*lead, n_blocks)) from grid units and rounded values in blocks
    (*lead, n_blocks, block); `usable` marks the blocks that take part in their group's sums."""
    units = torch.where(usable.unsqueeze(-1), units, torch.zeros_like(units)).to(torch.float64)
    q = torch.where(usable.unsqueeze(-1), q, torch.zeros_like(q)).to(torch.float64)
    num = fixed_point_terms(units * units).sum(dim=-1)  # (*lead, n_blocks)
    den = fixed_point_terms((units * q).abs()).sum(dim=-1)  # u and q share their sign
    n_blocks = num.shape[-1]
    pad = -n_blocks % group_blocks
    num_g = F.pad(num, (0, pad)).unflatten(-1, (-1, group_blocks)).sum(dim=-1).to(torch.float64)
    den_g = F.pad(den, (0, pad)).unflatten(-1, (-1, group_blocks)).sum(dim=-1).to(torch.float64)
    c = torch.where(den_g == 0, torch.ones_like(num_g), num_g / torch.where(den_g == 0, 1, den_g))
    c = c.to(torch.float32).repeat_interleave(group_blocks, dim=-1)
    return c[..., :n_blocks]


def correct_scales(
    blocks: torch.Tensor,
    q: torch.Tensor,
    scales: torch.Tensor,
    tensor_amax: torch.Tensor,
    spec: QuantSpec,
    uniform: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale values, stored codes) after the correction: `blocks` the finite float32 source
    values, q their elements rounded with `scales`, `uniform` one number in [0, 1) per block."""
    fmt = spec.scale_format.minifloat
    assert fmt is not None and isinstance(spec.block, int), "MS-EDEN needs two-level blocks"
    multipliers = two_level.encode_multipliers(scales, tensor_amax, spec)
    units = blocks * multipliers.unsqueeze(-1)
    if spec.sr_prescale != 1.0:
        units = units * spec.sr_prescale
    usable = scales > 0
    c = group_corrections(units, q, usable, spec.eden_group // spec.block)
    corrected = round_to_grid(scales * c, fmt, "sr", uniform=uniform)
    corrected = torch.where(usable, corrected, scales)
    return corrected, encode(corrected, fmt)
