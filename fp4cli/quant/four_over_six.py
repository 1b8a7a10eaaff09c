"""Four-over-six block scaling (Cook et al., arXiv 2512.02010): each block is quantized with its
amax scaled to 6 (E2M1's largest value) and to 4, and keeps the candidate whose decoded values
lie nearer the block's. Scaled to 4, a block's largest values land on 4 and the grid above them
(4, 6) is used less, which lowers the error of near-maximal values, the ones FP4 represents worst.

The error of a candidate is an exact integer sum, so that no summation order (a kernel's, a 2-D
tile read down its columns instead of along its rows) can change which candidate wins. For a
block whose finite amax a has the float32 exponent field f (a < 2^E with E = max(f, 1) - 126),
each value x with decoded value d adds

    trunc(min(((d - x) * 2^(24 - E))^2, 2^54))        (float64 operations, then int64)

(d - x in float64 from the two float32 values; the power of two is exact). These are the squared
errors in units of 2^-48 of a^2's binade. A finite decoded value is at most twice a, so a term
stays under 2^52 (the cap is a guard) and a block's sum (up to 256 terms, a 16 x 16 tile)
under 2^63. A candidate with a value that decodes to Inf or NaN (an infinite decode factor) has
an infinite error, the int64 maximum. The candidate scaled to 4 wins only when its error is
strictly smaller (an all-zero block, a tie, two infinite errors, keep 6).

The absolute-error metric ("mae", TransformerEngine's default; `QuantSpec.four_over_six_metric`)
adds `trunc(min(|d - x| * 2^(48 - E), 2^54))` instead (the product exact: a power of two): the
absolute errors in units of 2^-48 of a's binade, each under 3 * 2^48, a block's sum under 2^58.
"""

from __future__ import annotations

import torch

FOUR = 4.0  # the other candidate's element max
TERM_MAX = 2.0**54  # a guard: finite decoded values give terms under 2^52
INFINITE = torch.iinfo(torch.int64).max  # the error of a candidate with a non-finite value
UNIT_EXPONENT = 150  # 24 - E = 150 - max(f, 1)
ABSOLUTE_UNIT = 2.0**24  # 2^(48 - E) = 2^(24 - E) * 2^24: the absolute error's finer unit


def error_units(block_amax: torch.Tensor) -> torch.Tensor:
    """2^(24 - E) (float64) for each block's finite float32 amax, E as the module says."""
    field = (block_amax.contiguous().view(torch.int32) >> 23) & 0xFF
    exponent = UNIT_EXPONENT - field.clamp(min=1).to(torch.int64)
    return ((exponent + 1023) << 52).view(torch.float64)  # the float64 with that exponent


def block_errors(
    blocks: torch.Tensor, decoded: torch.Tensor, block_amax: torch.Tensor, metric: str = "mse"
) -> torch.Tensor:
    """Each block's error (int64, the module's sum of squared or, `metric` "mae", absolute
    errors) of `decoded` against `blocks` (float32, a block's values on the last axis)."""
    difference = decoded.to(torch.float64) - blocks.to(torch.float64)
    scaled = difference * error_units(block_amax).unsqueeze(-1)
    error = scaled.abs() * ABSOLUTE_UNIT if metric == "mae" else scaled * scaled
    finite = torch.isfinite(decoded)
    terms = torch.where(finite, torch.clamp(error, max=TERM_MAX), 0.0)
    errors = terms.to(torch.int64).sum(dim=-1)
    return torch.where(finite.all(dim=-1), errors, INFINITE)


def prefer_four(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    decoded_six: torch.Tensor,
    decoded_four: torch.Tensor,
    metric: str = "mse",
) -> torch.Tensor:
    """Per block (the last axis holds a block's values; `block_amax` its finite amax): whether
    the candidate scaled to 4 is strictly nearer `blocks` than the one scaled to 6, by `metric`
    ("mse" or "mae")."""
    error_six = block_errors(blocks, decoded_six, block_amax, metric)
    return block_errors(blocks, decoded_four, block_amax, metric) < error_six
