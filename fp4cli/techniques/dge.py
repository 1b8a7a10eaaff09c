"""DGE: Wang et al.'s differentiable gradient estimator for the weight quantizer.

Inside each interval [l, l + d) of the element grid (on the scaled weight w / s), the step of
the quantizer is replaced by a smooth surrogate whose derivative is
    f'(x) = (1 / k) * |2 (x - l) / d - 1| ^ (1 / k - 1),   capped at `cap`,
and the weight's gradient is multiplied elementwise by f'. Uncapped, f' averages exactly 1 over
an interval (the straight-through scale); the cap removes the integrable peak at the interval's
middle, so with k = 5 and cap 3 it averages about 0.59. At the grid's largest value the last
interval's value applies (1/k: 0.2 for k = 5 at |x| = 6), as Wang et al.'s kernel computes it
(its last E2M1 interval is [4, 6], closed); beyond it (clipped weights) the derivative is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.formats import Minifloat, float32, grid_interval
from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DGEConfig:
    k: float = 5.0
    cap: float = 3.0

    def __post_init__(self) -> None:
        if not _number(self.k) or not 1 < self.k <= K_MAX:
            raise SpecError(f"k: must be a number > 1 and at most {K_MAX:g} (got {self.k!r})")
        if not _number(self.cap) or not 1 <= self.cap < math.inf:
            raise SpecError(f"cap: must be a finite number >= 1 (got {self.cap!r})")

    @property
    def exponent(self) -> float:
        """1 / k - 1, the power of f' (negative: f' grows toward the interval's middle)."""
        return 1 / self.k - 1

    @property
    def inverse_k(self) -> float:
        """1 / k as float32 divides (1.0f / k): f' multiplies by it, which is also what a CUDA
        tensor divided by the number k computes, so every device gives the same bits."""
        return float32(1.0 / float32(self.k))  # in double, then rounded: the float32 quotient


K_MAX = 100.0  # Wang et al. use 3 to 5; beyond 100 the surrogate is the straight step


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _interval(scaled: torch.Tensor, fmt: Minifloat) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid interval [lower, lower + width) holding |scaled|; the last one is closed
    ([4, 6] for E2M1); width 0 beyond the grid."""
    import torch

    top = torch.full_like(scaled, fmt.max_value)
    below_top = torch.nextafter(top, torch.zeros_like(top))  # inside the last interval
    at_top = scaled.abs() == fmt.max_value
    lower, upper = grid_interval(torch.where(at_top, below_top, scaled), fmt)
    return lower, upper - lower


def dge_surrogate(scaled: torch.Tensor, fmt: Minifloat, k: float) -> torch.Tensor:
    """The smooth surrogate of the quantizer on the scaled weight (odd in x)."""
    import torch

    lower, width = _interval(scaled, fmt)
    inside = width > 0
    safe_width = torch.where(inside, width, torch.ones_like(width))
    t = 2 * (scaled.abs() - lower) / safe_width - 1  # in [-1, 1)
    smooth = lower + safe_width / 2 * (1 + torch.sign(t) * t.abs().pow(1 / k))
    magnitude = torch.where(inside, smooth, torch.full_like(smooth, fmt.max_value))
    return torch.copysign(magnitude, scaled)


def dge_derivative(scaled: torch.Tensor, fmt: Minifloat, config: DGEConfig) -> torch.Tensor:
    """f'(scaled), capped at config.cap; 0 beyond the grid."""
    import torch

    lower, width = _interval(scaled, fmt)
    inside = width > 0
    safe_width = torch.where(inside, width, torch.ones_like(width))
    t = (2 * (scaled.abs() - lower) / safe_width - 1).abs()
    derivative = torch.where(
        t > 0, t.pow(config.exponent) * config.inverse_k, torch.full_like(t, float(config.cap))
    )
    derivative = derivative.clamp(max=config.cap)
    return torch.where(inside, derivative, torch.zeros_like(derivative))
