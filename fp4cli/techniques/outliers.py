"""Outlier clamping with optional compensation (Wang et al.).

Per token (row of the activation, along in_features), values are clamped to the token's
[1 - q, q] quantiles (q = 0.99). The clamped tensor goes through the FP4 GEMM; with compensation,
the residual X - clamp(X) (sparse: about 2% non-zeros at q = 0.99) is multiplied by the weight
in high precision and added to the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class OutlierConfig:
    quantile: float = 0.99
    compensate: bool = True

    def __post_init__(self) -> None:
        q = self.quantile
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.5 < q < 1:
            raise SpecError(f"quantile: must be in (0.5, 1) (got {q!r})")
        if not isinstance(self.compensate, bool):
            raise SpecError("compensate: must be true or false")


def row_quantiles(x: torch.Tensor, q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The (1 - q) and q quantiles of each row of x (last dim), linear interpolation."""
    ordered = x.sort(dim=-1).values
    n = x.shape[-1]

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

    low, high = row_quantiles(x.detach(), config.quantile)
    clamped = torch.minimum(torch.maximum(x, low), high)
    return clamped, x - clamped
