"""Outlier clamping with optional compensation (Wang et al.).

Per token (row of the activation, along in_features), values are clamped to the token's
[1 - q, q] quantiles (q = 0.99). The clamped tensor goes through the FP4 quantizer; with
compensation, the residual X - clamp(X) (sparse: about 2% non-zeros at q = 0.99) is added back
to the dequantized activation in high precision, so it reaches the forward GEMM and the
weight-gradient GEMM alike (as Wang et al.'s code adds it before its FP8 cast).

Quantiles: "nearest" (the released code): the sorted row's values at 0-based ranks
int((1 - q) n) and int(q n) (so a row of n < 1 / (1 - q) values is not clamped at all), as
both the official repository (`msamp/operators/fp4_quantize/fp4_quantize.py`) and the first
author's research fork compute it: the fork's training layer (`msamp/megatron/layers.py`,
branch fp4) quantizes through `FP4_QUANT`, whose clamp sorts the same way
(`msamp/operators/fp4_quant/fp4_quant.py`). "linear": linear interpolation between ranks, at
(1 - q)(n - 1) and q (n - 1) (torch.quantile's default): the fork's older helper
(`msamp/nn/functional.py`, `apply_quantile_clipping`) calls torch.quantile, but the training
layer no longer imports it. An option, not the reading of either code's training path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch

QUANTILE_METHODS = ("nearest", "linear")


@dataclass(frozen=True)
class OutlierConfig:
    quantile: float = 0.99
    compensate: bool = True
    method: str = "nearest"

    def __post_init__(self) -> None:
        q = self.quantile
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.5 < q < 1:
            raise SpecError(f"quantile: must be in (0.5, 1) (got {q!r})")
        if not isinstance(self.compensate, bool):
            raise SpecError("compensate: must be true or false")
        if self.method not in QUANTILE_METHODS:
            raise SpecError(
                f"method: must be one of {', '.join(QUANTILE_METHODS)} (got {self.method!r})"
            )


def nearest_ranks(n: int, q: float) -> tuple[int, int]:
    """The 0-based ranks, in a sorted row of n values, of the "nearest" (1 - q) and q
    quantiles."""
    low, high = (min(int(p * n), n - 1) for p in (1 - q, q))
    return low, high


def row_quantiles(
    x: torch.Tensor, q: float, method: str = "nearest"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (1 - q) and q quantiles of each row of x (last dim), as (rows, 1) tensors."""
    ordered = x.sort(dim=-1).values
    n = x.shape[-1]
    if method == "nearest":
        low, high = nearest_ranks(n, q)
        return ordered[..., low : low + 1], ordered[..., high : high + 1]

    def at(p: float) -> torch.Tensor:
        position = p * (n - 1)
        below = int(position)
        above = min(below + 1, n - 1)
        weight = position - below
        return ordered[..., below] * (1 - weight) + ordered[..., above] * weight

    return at(1 - q).unsqueeze(-1), at(q).unsqueeze(-1)


def clamp_outliers(x: torch.Tensor, config: OutlierConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(clamped x, residual x - clamped) with per-row quantile clamping."""
    import torch

    low, high = row_quantiles(x.detach(), config.quantile, config.method)
    clamped = torch.minimum(torch.maximum(x, low), high)
    return clamped, x - clamped
