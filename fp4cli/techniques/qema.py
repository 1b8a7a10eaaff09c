"""Q-EMA (TetraJet): round the weight toward its exponential moving average.

W_ema = beta * W_ema + (1 - beta) * W after every optimizer step (starting from W). The weight is
quantized with the scale computed from W itself, but of the two grid points that bracket W / s,
the one nearer W_ema / s is chosen. Until `warmup` updates have been made, plain rounding is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class QEMAConfig:
    beta: float = 0.998
    warmup: int = 10

    def __post_init__(self) -> None:
        b = self.beta
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < 1:
            raise SpecError(f"beta: must be in (0, 1) (got {b!r})")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise SpecError(f"warmup: must be a non-negative integer (got {self.warmup!r})")


@dataclass(frozen=True)
class AverageGuide:
    """Q-EMA's guide for a weight's rounding: the average (float32, the weight's shape) once
    `updates` (a 0-d int64 tensor, on the average's device) has reached `warmup`; before that
    the weight itself, so that guided rounding is plain nearest-even. Kept unformed, so that a
    kernel reading the weight can choose per value instead of a pass writing the guide."""

    average: torch.Tensor
    updates: torch.Tensor
    warmup: int

    def values(self, weight: torch.Tensor) -> torch.Tensor:
        """The guide as a float32 tensor: the definition."""
        import torch

        ready = self.updates >= self.warmup
        return torch.where(ready, self.average, weight.detach().to(torch.float32))


def update_ema(ema: torch.Tensor, weight: torch.Tensor, beta: float, updates: torch.Tensor) -> None:
    """One EMA step in place; the first update (updates == 0) copies the weight."""
    import torch

    with torch.no_grad():
        weight = weight.to(ema.dtype)
        ema.copy_(torch.where(updates == 0, weight, ema * beta + weight * (1 - beta)))
