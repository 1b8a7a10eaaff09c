"""Q-EMA (TetraJet): round the weight toward its exponential moving average.

W_ema = beta * W_ema + (1 - beta) * W after every optimizer step. The weight is quantized with
the scale computed from W itself, but of the two grid points that bracket W / s, the one nearer
W_ema / s is chosen. Until `warmup` updates have been made, plain rounding is used.

Where the average starts (`start`): "weight", the paper's definition: the first update copies W.
"layer_init", as TetraJet's released code runs it: the average starts from a draw of
nn.Linear's default initialization (Kaiming-uniform, a = sqrt(5): uniform in +-1/sqrt(in)), made
when the layer is built and independent of W (the code clones the layer's weight before the
model re-initializes it), and every update, the first included, blends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch

STARTS = ("weight", "layer_init")


@dataclass(frozen=True)
class QEMAConfig:
    beta: float = 0.998
    warmup: int = 10
    # left out of a resolved recipe at its default, so recipes resolved before it keep their form
    start: str = field(default="weight", metadata={"omit_default": True})

    def __post_init__(self) -> None:
        b = self.beta
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < 1:
            raise SpecError(f"beta: must be in (0, 1) (got {b!r})")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise SpecError(f"warmup: must be a non-negative integer (got {self.warmup!r})")
        if self.start not in STARTS:
            raise SpecError(f"start: must be one of {', '.join(STARTS)} (got {self.start!r})")

    @property
    def first_update_copies(self) -> bool:
        """Whether the first update sets the average to the weight (start "weight")."""
        return self.start == "weight"


def layer_init_average(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """A (out, in) float32 draw of nn.Linear's default weight initialization (kaiming_uniform_
    with a = sqrt(5), as `nn.Linear.reset_parameters`), on the CPU from a generator seeded with
    `seed`: the same tensor on every device."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    average = torch.empty(out_features, in_features, dtype=torch.float32)
    return torch.nn.init.kaiming_uniform_(average, a=math.sqrt(5), generator=generator)


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


def update_ema(
    ema: torch.Tensor,
    weight: torch.Tensor,
    beta: float,
    updates: torch.Tensor,
    first_copies: bool = True,
) -> None:
    """One EMA step in place; with `first_copies` the first update (updates == 0) copies the
    weight (start "weight"), else every update blends (start "layer_init")."""
    import torch

    with torch.no_grad():
        weight = weight.to(ema.dtype)
        stepped = ema * beta + weight * (1 - beta)
        ema.copy_(torch.where(updates == 0, weight, stepped) if first_copies else stepped)
