"""FP4 All the Way's stopping rule read from a run's statistics: the model's weight-gradient
norm against its quantization noise, and the step at which it first fell below sqrt(3).

The rows come from `--stats-every` (fp4cli.train.stats_grad_noise): per quantized layer l and
statistics step, grad_norm_l = ||G_l|| (the weight-gradient GEMM without quantization) and
noise_norm_l = ||G_q,l - G_l|| (what quantization added). For the model at that step:

    R = sqrt(sum_l grad_norm_l^2) / sqrt(sum_l noise_norm_l^2)

the norm of the whole gradient over the norm of its noise (inf without noise). Chmiel et al.
(arXiv 2505.19115) find that quantized training stops gaining once the gradient norm falls
below about sqrt(3) times the quantization noise (per coordinate: ||grad|| < sqrt(3 d) sigma,
sigma the noise's standard deviation over d coordinates), and then switch the backward and
update GEMMs to higher precision. `crossing_step` is the first statistics step with
R < sqrt(3): a single draw of the noise per step, so a ratio near the threshold may cross back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PAPER_THRESHOLD = math.sqrt(3.0)  # FP4 All the Way: ||grad|| < sqrt(3) x the noise norm
OPERAND = "grad_weight"  # the operand name of the rows (fp4cli.train.stats_grad_noise)


@dataclass(frozen=True)
class GradNoisePoint:
    """The model's weight gradient at one statistics step, over `layers` quantized layers."""

    step: int
    grad_norm: float  # sqrt(sum_l ||G_l||^2)
    noise_norm: float  # sqrt(sum_l ||G_q,l - G_l||^2)
    layers: int

    @property
    def ratio(self) -> float:
        """grad_norm / noise_norm; inf without noise."""
        return noise_ratio(self.grad_norm, self.noise_norm)


def noise_ratio(grad_norm: float, noise_norm: float) -> float:
    """grad_norm / noise_norm; inf when there is no noise (nan for 0 / 0)."""
    if noise_norm == 0:
        return math.nan if grad_norm == 0 else math.inf
    return grad_norm / noise_norm


def grad_noise_series(rows: Iterable[dict[str, Any]]) -> list[GradNoisePoint]:
    """The model's points, oldest first, from quant_stats rows {step, layer, operand, metric,
    value} (rows of other operands and metrics are ignored)."""
    squares: dict[int, dict[str, dict[str, float]]] = {}  # step -> metric -> layer -> value^2
    for row in rows:
        if row["operand"] == OPERAND and row["metric"] in ("grad_norm", "noise_norm"):
            by_layer = squares.setdefault(row["step"], {}).setdefault(row["metric"], {})
            by_layer[row["layer"]] = float(row["value"]) ** 2
    points = []
    for step in sorted(squares):
        grads, noises = squares[step].get("grad_norm", {}), squares[step].get("noise_norm", {})
        layers = grads.keys() & noises.keys()  # a layer counts with both of its norms
        grad = math.sqrt(sum(grads[name] for name in layers))
        noise = math.sqrt(sum(noises[name] for name in layers))
        points.append(GradNoisePoint(step, grad, noise, len(layers)))
    return points


def crossing_step(
    series: Sequence[GradNoisePoint], threshold: float = PAPER_THRESHOLD
) -> int | None:
    """The first step whose ratio is below `threshold`, or None (not reached)."""
    return next((point.step for point in series if point.ratio < threshold), None)


def load_grad_noise(store: Any, run_id: str) -> list[GradNoisePoint]:
    """A run's points (empty for a run trained without --stats-every or without a quantized
    weight-gradient GEMM)."""
    return grad_noise_series(store.quant_stats(run_id, operand=OPERAND))
