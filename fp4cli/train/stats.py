"""Quantization statistics during training, every `stats_every` steps (nothing when off).

Per quantized layer and operand: rel_mse, snr_db, clipped, flushed (fp4cli.linear.stats), from
the step's own forward and backward pass. Per quantized weight, over the window since the last
statistics step (TetraJet's oscillation counters): `osc_ratio_mean` (mean of dist_Q / dist_W,
the quantized weight's total movement over the latent weight's), `osc_share` (share of weights
with that ratio above 16), `rate_w` and `rate_qw` (mean over steps of ||X_t - X_t-1|| /
||X_t-1|| for W and Q(W)), and quantization confidence: `conf_mean` and `conf_low` (share below
0.1), where conf(w) = distance of w/s to the nearest rounding threshold over half the local grid
gap, in [0, 1].
"""

from __future__ import annotations

import torch
import torch.nn as nn

from fp4cli.formats import grid_interval
from fp4cli.linear import QuantLinear, quantized_layers
from fp4cli.quant import quantize

OSCILLATION_THRESHOLD = 16.0


class _Window:
    """Oscillation counters of one weight since the last statistics step."""

    def __init__(self, layer: QuantLinear) -> None:
        self.prev_w = layer.weight.detach().float().clone()
        self.prev_q = layer.quantized_weight().float()
        self.dist_w = torch.zeros_like(self.prev_w)
        self.dist_q = torch.zeros_like(self.prev_w)
        self.rate_w = torch.zeros((), device=self.prev_w.device)
        self.rate_q = torch.zeros((), device=self.prev_w.device)
        self.steps = 0

    def update(self, layer: QuantLinear) -> None:
        w = layer.weight.detach().float()
        q = layer.quantized_weight().float()
        self.dist_w += (w - self.prev_w).abs()
        self.dist_q += (q - self.prev_q).abs()
        self.rate_w += (w - self.prev_w).norm() / self.prev_w.norm().clamp_min(1e-30)
        self.rate_q += (q - self.prev_q).norm() / self.prev_q.norm().clamp_min(1e-30)
        self.prev_w, self.prev_q = w, q
        self.steps += 1

    def summary(self) -> dict[str, torch.Tensor]:
        moved = self.dist_w > 0
        ratio = torch.where(moved, self.dist_q / self.dist_w.clamp_min(1e-30), 0.0)
        steps = max(self.steps, 1)
        return {
            "osc_ratio_mean": ratio.mean(),
            "osc_share": (ratio > OSCILLATION_THRESHOLD).float().mean(),
            "rate_w": self.rate_w / steps,
            "rate_qw": self.rate_q / steps,
        }


def quant_confidence(layer: QuantLinear) -> torch.Tensor:
    """Per weight: distance to the nearest rounding threshold over half the local grid gap."""
    spec = layer.config.forward_w
    assert spec is not None
    w = layer.weight.detach().float()
    units = quantize(w, spec, seed=0).grid_units(w).abs()
    lower, upper = grid_interval(units, spec.element_format)
    half_gap = (upper - lower) / 2
    threshold = lower + half_gap
    confidence = (units - threshold).abs() / half_gap
    beyond = upper == lower  # at or past the grid's largest value: nothing to flip to
    return torch.where(beyond, torch.ones_like(confidence), confidence.clamp(0, 1))


class QuantStatsCollector:
    """Turns the layers' recorded statistics into run-store rows."""

    def __init__(self, model: nn.Module, enabled: bool) -> None:
        self.layers = quantized_layers(model)
        self.enabled = enabled
        self.windows: dict[str, _Window] = {}

    def begin(self, collect: bool) -> None:
        """Before a step's forward pass: record operand statistics on this step or not."""
        for layer in self.layers.values():
            layer.stats = {} if collect else None

    def after_step(self) -> None:
        """After the optimizer step: advance the oscillation windows (only when stats are on)."""
        if not self.enabled:
            return
        for name, layer in self.layers.items():
            if layer.config.forward_w is None:
                continue
            if name not in self.windows:
                self.windows[name] = _Window(layer)
            else:
                self.windows[name].update(layer)

    def rows(self) -> list[tuple[str, str, str, float]]:
        """(layer, operand, metric, value) rows for this statistics step; resets the windows."""
        rows: list[tuple[str, str, str, float]] = []
        for name, layer in self.layers.items():
            for (operand, metric), value in (layer.stats or {}).items():
                rows.append((name, operand, metric, float(value)))
            layer.stats = None
            window = self.windows.get(name)
            if window is not None and window.steps > 0:
                values = window.summary()
                confidence = quant_confidence(layer)
                values["conf_mean"] = confidence.mean()
                values["conf_low"] = (confidence < 0.1).float().mean()
                rows += [(name, "weight", k, float(v)) for k, v in values.items()]
                self.windows[name] = _Window(layer)
        return rows
