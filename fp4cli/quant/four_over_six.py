"""Four-over-six block scaling (Cook et al., arXiv 2512.02010): each block is quantized with its
amax scaled to 6 (E2M1's largest value) and to 4, and keeps the candidate whose decoded values
lie nearer the block's. Scaled to 4, a block's largest values land on 4 and the grid above them
(4, 6) is used less, which lowers the error of near-maximal values, the ones FP4 represents worst.

The error of a candidate is the sum over the block of (decoded - x)^2, each term and the sum in
float64 (the terms are exact there); the candidate scaled to 4 wins only when strictly nearer.
"""

from __future__ import annotations

import torch

FOUR = 4.0  # the other candidate's element max


def prefer_four(
    blocks: torch.Tensor, decoded_six: torch.Tensor, decoded_four: torch.Tensor
) -> torch.Tensor:
    """Per block (the last axis holds a block's values): whether the candidate scaled to 4
    is strictly nearer `blocks` than the one scaled to 6."""
    source = blocks.to(torch.float64)
    error_six = (decoded_six.to(torch.float64) - source).square().sum(dim=-1)
    error_four = (decoded_four.to(torch.float64) - source).square().sum(dim=-1)
    return error_four < error_six
