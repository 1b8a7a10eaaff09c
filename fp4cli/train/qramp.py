"""Q-Ramping (TetraJet): AdamW that updates oscillating quantized weights less often.

Calibration (at the start and every `interval` steps): `calibration_steps` steps of plain AdamW
are run and then undone (model and optimizer restored), accumulating per weight
dist_W = sum |dW| and dist_Q = sum |dQ(W)|. With R = dist_Q / dist_W, each weight of a quantized
layer gets the update period min(floor(R / alpha) * beta + 1, max_period). The optimizer then
accumulates each weight's gradient and updates it only every `period` steps, with the mean
gradient and the learning rate times the number of accumulated steps. Periods, accumulators and
per-element step counts live in the optimizer state, so checkpoints carry them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from fp4cli.linear import quantized_layers


class QRampAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay); parameters with a `period` in their state update only when
    their per-element accumulation count reaches it. Without periods it is plain AdamW."""

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
            state["steps"] = torch.zeros_like(param, dtype=torch.float32)  # per element
        period = None if self.plain else state.get("period")
        if period is None:
            ready = torch.ones_like(grad, dtype=torch.bool)
            count = torch.ones_like(grad)
        else:
            state["accum"] += grad
            state["count"] += 1
            count = state["count"].clone()
            ready = count >= period
            grad = state["accum"] / count
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq, steps = state["exp_avg"], state["exp_avg_sq"], state["steps"]
        exp_avg.copy_(torch.where(ready, beta1 * exp_avg + (1 - beta1) * grad, exp_avg))
        exp_avg_sq.copy_(
            torch.where(ready, beta2 * exp_avg_sq + (1 - beta2) * grad * grad, exp_avg_sq)
        )
        steps.add_(ready.float())
        safe_steps = steps.clamp_min(1)
        m_hat = exp_avg / (1 - beta1**safe_steps)
        v_hat = exp_avg_sq / (1 - beta2**safe_steps)
        lr = group["lr"] * count  # lr times the number of accumulated steps
        decayed = param.float() * (1 - lr * group["weight_decay"])
        updated = decayed - lr * m_hat / (v_hat.sqrt() + group["eps"])
        param.copy_(torch.where(ready, updated, param.float()).to(param.dtype))
        if period is not None:
            state["accum"].masked_fill_(ready, 0.0)
            state["count"].masked_fill_(ready, 0.0)

    def set_periods(self, periods: dict[torch.Tensor, torch.Tensor]) -> None:
        """Install per-element periods (float tensors >= 1) for the given parameters."""
        for param, period in periods.items():
            state = self.state[param]
            state["period"] = period.float()
            state.setdefault("accum", torch.zeros_like(param, dtype=torch.float32))
            state.setdefault("count", torch.zeros_like(param, dtype=torch.float32))


def calibrate(
    model: nn.Module,
    optimizer: QRampAdamW,
    train_step: Callable[[int], None],
    config: Any,
) -> dict[str, float]:
    """Run config.calibration_steps plain steps, undo them, and set the update periods.

    train_step(i) must run forward, backward and optimizer.step() for calibration step i.
    Returns summary numbers (mean period, share of weights with period > 1).
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
    prev_w = {n: l.weight.detach().float().clone() for n, l in layers.items()}
    prev_q = {n: l.quantized_weight().float() for n, l in layers.items()}
    optimizer.plain = True
    try:
        for i in range(config.calibration_steps):
            train_step(i)
            for name, layer in layers.items():
                w, q = layer.weight.detach().float(), layer.quantized_weight().float()
                dist_w[name] += (w - prev_w[name]).abs()
                dist_q[name] += (q - prev_q[name]).abs()
                prev_w[name], prev_q[name] = w, q
    finally:
        optimizer.plain = False
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
    periods = {}
    for name, layer in layers.items():
        ratio = dist_q[name] / dist_w[name].clamp_min(1e-30)
        period = torch.floor(ratio / config.alpha) * config.beta + 1
        periods[layer.weight] = period.clamp(max=config.max_period)
    optimizer.set_periods(periods)
    every = torch.cat([p.flatten() for p in periods.values()]) if periods else torch.ones(1)
    return {
        "qramp_mean_period": every.mean().item(),
        "qramp_share_slowed": (every > 1).float().mean().item(),
    }
