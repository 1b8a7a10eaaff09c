"""QuEST's trust estimator: a forward operand's gradient passes only where its value lay near
the quantization grid, and is zero elsewhere.

Each forward operand (X, W) is quantized with its spec; v is a value in grid units (over its
block scale, times any pre-scale, after the forward Hadamard transform if there is one) and q
the grid value it rounded to. The backward GEMM gives the gradient of the quantized operand;
the gradient of the operand itself is that gradient where the mask holds, else 0 (taken back
through the forward transform, in `fp4cli.linear.function`). Two rules:

- "clip": the mask holds where |v| < m + bound, m the element format's largest value: bound 0
  zeroes the gradient of every value the grid clipped (Quartet's code: `|v| < 6`).
- "error": the mask holds where |v - q| <= bound: QuEST's trust region |Q(x) - x| <= T, with
  T in grid units (its code states T in RMS units). A bound of half the grid's largest gap
  (1 for E2M1) passes every value inside the grid and those up to one unit beyond it.

The mask is computed in the forward pass (one more quantization of X and W with the same
seeds, guide and transform, so the same bits) and kept as booleans for the backward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.quant.spec import SpecError

if TYPE_CHECKING:
    import torch

    from fp4cli.quant import QuantSpec
    from fp4cli.quant.random_bits import Seed
    from fp4cli.techniques.hadamard import FixedSigns

RULES = ("clip", "error")
BOUND_MAX = 64.0


@dataclass(frozen=True)
class TrustConfig:
    rule: str = "clip"
    bound: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.rule, str) or self.rule not in RULES:
            raise SpecError(f"rule: must be one of {', '.join(RULES)} (got {self.rule!r})")
        bound = self.bound
        number = isinstance(bound, (int, float)) and not isinstance(bound, bool)
        if not number or not (0 <= bound <= BOUND_MAX and math.isfinite(bound)):
            raise SpecError(
                f"bound: must be a number in [0, {BOUND_MAX:g}] grid units (got {bound!r})"
            )


def trust_mask(
    units: torch.Tensor, grid: torch.Tensor | None, config: TrustConfig, element_max: float
) -> torch.Tensor:
    """Where the gradient passes (bool): `units` the values in grid units, `grid` the grid
    values they rounded to (the "error" rule's; same shape). Non-finite values never pass."""
    if config.rule == "clip":
        return units.abs() < element_max + config.bound
    assert grid is not None
    return (units - grid).abs() <= config.bound


def operand_mask(
    tensor: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    seed: Seed,
    hadamard: tuple[int, Seed | FixedSigns] | None,
    config: TrustConfig,
    guide: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """The trust mask of a forward operand quantized as the layer quantizes it (`spec` along
    `axis`, the same seed, Q-EMA guide and Hadamard (size, signs)): bool, in the shape of the
    transformed (padded) operand."""
    from fp4cli.quant import quantize
    from fp4cli.techniques.hadamard import rht

    size, signs = hadamard if hadamard is not None else (None, None)
    source = tensor
    if size:
        source = rht(tensor, axis, size, signs)
        guide = rht(guide, axis, size, signs) if guide is not None else None
    quantized = quantize(source, spec, axis=axis, seed=seed, guide=guide, backend=backend)
    units = quantized.grid_units(source)
    grid = None
    if config.rule == "error":
        padded = quantized.element_values()  # the padded, axis-last layout of the codes
        grid = quantized.layout.unpad(padded).movedim(-1, axis)
    return trust_mask(units, grid, config, spec.element_format.max_value)
