"""Q-Ramping (TetraJet): AdamW that updates oscillating quantized weights less often.

As TetraJet's released optimizer (`adamw_bs_ramping.py`) computes it, per parameter and step t
(the global step: every step counts, updated or not):
  1. weight decay on the whole tensor: W = W * (1 - lr * weight_decay);
  2. each weight adds its gradient to an accumulator (a gradient tensor holding a NaN or an Inf
     is left out) and counts the step; it updates when count % period == 0;
  3. an updating weight takes the mean accumulated gradient g into Adam's moments, and moves by
     lr * count / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps);
     its accumulator and count then restart from zero.
Without periods (or during calibration) this is AdamW exactly.

Calibration (at the start and every `interval` steps): calibration_steps + 1 steps of plain
AdamW are run and then undone (model and optimizer restored). Over the calibration_steps
differences between consecutive steps' weights (the first step only sets the starting point),
each weight accumulates dist_W = sum |dW| and dist_Q = sum |dQ(W)|, Q the forward weight
quantizer with plain deterministic rounding (no Q-EMA guide), and gets the period
min(floor((dist_Q / alpha) / (dist_W + 1e-8)) * beta + 1, max_period). Periods, accumulators,
counts and step counts live in the optimizer state, so checkpoints carry them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from fp4cli.linear import QuantLinear, quantized_layers
from fp4cli.quant import fake_quantize

RATIO_EPS = 1e-8  # added to dist_W, as the reference does


class QRampAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay); parameters with a `period` in their state update only when
    their per-element accumulation count is a multiple of it. Without periods it is AdamW."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )
        self.plain = False  # during calibration: ignore periods

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, param.grad.float(), group)
        return loss

    def _update(self, param: torch.Tensor, grad: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[param]
        if "exp_avg" not in state:  # set_periods may have created the state first
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32)  # the global step (host)
        state["step"] += 1
        lr, step = group["lr"], float(state["step"])
        param.mul_(1 - lr * group["weight_decay"])  # every step, every element
        ready, grad, count = self._accumulate(state, grad)
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.copy_(torch.where(ready, beta1 * exp_avg + (1 - beta1) * grad, exp_avg))
        exp_avg_sq.copy_(
            torch.where(ready, beta2 * exp_avg_sq + (1 - beta2) * grad * grad, exp_avg_sq)
        )
        step_size = lr * count / (1 - beta1**step)  # lr times the accumulated steps
        denom = exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step) + group["eps"]
        updated = param.float() - exp_avg / denom * step_size
        param.copy_(torch.where(ready, updated, param.float()).to(param.dtype))
        if "period" in state and not self.plain:
            state["accum"].masked_fill_(ready, 0.0)
            state["count"].masked_fill_(ready, 0.0)

    def _accumulate(
        self, state: dict[str, Any], grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float]:
        """(which elements update, the gradient they update with, their accumulated steps)."""
        period = None if self.plain else state.get("period")
        if period is None:
            return torch.ones_like(grad, dtype=torch.bool), grad, 1.0
        finite = torch.isfinite(grad).all()  # a non-finite gradient is not accumulated
        state["accum"] += torch.where(finite, grad, torch.zeros_like(grad))
        state["count"] += 1
        count = state["count"].clone()
        return torch.remainder(count, period) == 0, state["accum"] / count, count

    def set_periods(self, periods: dict[torch.Tensor, torch.Tensor]) -> None:
        """Install per-element periods (float tensors >= 1) for the given parameters; their
        accumulators and counts carry over a recalibration, as in the reference."""
        for param, period in periods.items():
            state = self.state[param]
            state["period"] = period.float()
            state.setdefault("accum", torch.zeros_like(param, dtype=torch.float32))
            state.setdefault("count", torch.zeros_like(param, dtype=torch.float32))


def plain_quantized_weight(layer: QuantLinear) -> torch.Tensor:
    """The forward weight quantizer's output with deterministic rounding and no Q-EMA guide
    (TetraJet's calibration measures Q(W) so, whatever the forward pass rounds with)."""
    spec = layer.config.forward_w
    assert spec is not None
    if spec.rounding == "sr":
        spec = spec.replace(rounding="rne", sr_prescale=1.0)
    return fake_quantize(layer.weight.detach(), spec, backend=layer.backend).float()


def calibrate(
    model: nn.Module,
    optimizer: QRampAdamW,
    train_step: Callable[[int], None],
    config: Any,
    max_period: int,
) -> dict[str, float]:
    """Run config.calibration_steps + 1 plain steps, undo them, and set the update periods
    (at most `max_period`).

    train_step(i) must run forward, backward and optimizer.step() for calibration step i.
    Returns summary numbers (mean period, share of weights with period > 1, the cap).
    """
    layers = {
        name: layer
        for name, layer in quantized_layers(model).items()
        if layer.config.forward_w is not None
    }
    model_state = copy.deepcopy(model.state_dict())
    optimizer_state = copy.deepcopy(optimizer.state_dict())
    dist_w = {n: torch.zeros_like(l.weight, dtype=torch.float32) for n, l in layers.items()}
    dist_q = {n: torch.zeros_like(l.weight, dtype=torch.float32) for n, l in layers.items()}
    prev: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    optimizer.plain = True
    try:
        for i in range(config.calibration_steps + 1):
            train_step(i)
            for name, layer in layers.items():
                w, q = layer.weight.detach().float().clone(), plain_quantized_weight(layer)
                if i > 0:  # the first step only sets the starting point
                    dist_w[name] += (w - prev[name][0]).abs()
                    dist_q[name] += (q - prev[name][1]).abs()
                prev[name] = (w, q)
    finally:
        optimizer.plain = False
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
    periods = {
        layer.weight: update_periods(dist_w[name], dist_q[name], config, max_period)
        for name, layer in layers.items()
    }
    optimizer.set_periods(periods)
    every = torch.cat([p.flatten() for p in periods.values()]) if periods else torch.ones(1)
    return {
        "qramp_mean_period": every.mean().item(),
        "qramp_share_slowed": (every > 1).float().mean().item(),
        "qramp_max_period": float(max_period),
    }


def update_periods(
    dist_w: torch.Tensor, dist_q: torch.Tensor, config: Any, max_period: int
) -> torch.Tensor:
    """min(floor((dist_Q / alpha) / (dist_W + 1e-8)) * beta + 1, max_period), per weight."""
    ratio = torch.div(dist_q / config.alpha, dist_w + RATIO_EPS, rounding_mode="floor")
    return (ratio * config.beta + 1).clamp(max=max_period)
