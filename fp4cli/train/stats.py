"""Quantization statistics during training, every `stats_every` steps (nothing when off).

Per quantized layer and operand: rel_mse, snr_db, clipped, flushed (fp4cli.linear.stats), from
the step's own forward and backward pass.

Per quantized weight, over the window of steps since the last statistics step (TetraJet's
oscillation counters), with W_t the latent weight and Q_t = Q(W_t) the forward-quantized weight
after step t:

- `osc_ratio_mean`: the mean over weights of dist_Q / dist_W, where dist_Q = sum_t |Q_t - Q_t-1|
  and dist_W = sum_t |W_t - W_t-1| per weight (0 for a weight that did not move);
- `osc_share`: the share of weights with that ratio above 16 (they oscillate);
- `rate_w`, `rate_qw`: the mean over the window's steps of ||W_t - W_t-1|| / ||W_t-1|| and
  ||Q_t - Q_t-1|| / ||Q_t-1|| (Frobenius norms);
- `rate_out`: the mean over the window's steps of ||P (Q_t - Q_t-1)^T|| / ||P Q_t-1^T||, the rate
  of change of the layer's output on a fixed probe P: the first (up to 64) rows of the layer's
  input in the forward pass of the step at which the window starts. 0 when Q does not change;
- quantization confidence at the statistics step, conf(w) = the distance of w/s to the nearest
  rounding threshold over half the local grid gap, in [0, 1] (1 at or beyond the grid's largest
  value): `conf_mean`, `conf_low` (the share below 0.1), and `conf_hist_0` .. `conf_hist_9`, the
  share of weights with conf in [i/10, (i+1)/10) (the last bin includes 1; the ten sum to 1).

Per layer whose weight-gradient GEMM is quantized, at the statistics step (operand
"grad_weight"): grad_norm, noise_norm and noise_ratio, the weight gradient against its
quantization noise (fp4cli.train.stats_grad_noise: FP4 All the Way's stopping rule).

When statistics are off the collector registers no hook and keeps no state. When on, a forward
pre-hook on each layer with a quantized weight copies its input only in the step a window
starts at. The open windows (previous weights, sums, probes) go into checkpoints
(`state_dict`), so a resumed run records the uninterrupted run's statistics.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from fp4cli.formats import grid_interval
from fp4cli.linear import QuantLinear, quantized_layers
from fp4cli.quant import quantize
from fp4cli.train.stats_grad_noise import GradNoiseMeter

OSCILLATION_THRESHOLD = 16.0
PROBE_ROWS = 64
CONF_BINS = 10
WINDOW_TENSORS = ("prev_w", "prev_q", "dist_w", "dist_q", "rate_w", "rate_q", "rate_out")


class _Window:
    """Oscillation counters of one weight since the last statistics step.

    probe: (n, in_features) inputs the output's rate of change is measured on, or None.
    """

    def __init__(self, layer: QuantLinear, probe: torch.Tensor | None) -> None:
        self.prev_w = layer.weight.detach().float().clone()  # (out, in)
        self.prev_q = layer.quantized_weight().float()  # (out, in)
        self.probe = probe
        self.dist_w = torch.zeros_like(self.prev_w)
        self.dist_q = torch.zeros_like(self.prev_w)
        self.rate_w = torch.zeros((), device=self.prev_w.device)
        self.rate_q = torch.zeros((), device=self.prev_w.device)
        self.rate_out = torch.zeros((), device=self.prev_w.device)
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        """Copies of the counters, the previous weights and the probe (None when there is none)."""
        state: dict[str, Any] = {name: getattr(self, name).clone() for name in WINDOW_TENSORS}
        state["probe"] = None if self.probe is None else self.probe.clone()
        return state | {"steps": self.steps}

    @classmethod
    def restored(cls, state: dict[str, Any], device: torch.device) -> _Window:
        """The window a `state_dict()` was taken of, on `device`."""
        window = cls.__new__(cls)
        for name in WINDOW_TENSORS:
            setattr(window, name, state[name].to(device))
        window.probe = None if state["probe"] is None else state["probe"].to(device)
        window.steps = int(state["steps"])
        return window

    def update(self, layer: QuantLinear) -> None:
        w = layer.weight.detach().float().clone()  # the optimizer updates the weight in place
        q = layer.quantized_weight().float()
        self.dist_w += (w - self.prev_w).abs()
        self.dist_q += (q - self.prev_q).abs()
        self.rate_w += _relative_change(w - self.prev_w, self.prev_w)
        self.rate_q += _relative_change(q - self.prev_q, self.prev_q)
        if self.probe is not None:
            out_change = self.probe @ (q - self.prev_q).T  # (n, out)
            out_before = self.probe @ self.prev_q.T  # (n, out)
            self.rate_out += _relative_change(out_change, out_before)
        self.prev_w, self.prev_q = w, q
        self.steps += 1

    def summary(self) -> dict[str, torch.Tensor]:
        moved = self.dist_w > 0
        ratio = torch.where(moved, self.dist_q / self.dist_w.clamp_min(1e-30), 0.0)
        steps = max(self.steps, 1)
        values = {
            "osc_ratio_mean": ratio.mean(),
            "osc_share": (ratio > OSCILLATION_THRESHOLD).float().mean(),
            "rate_w": self.rate_w / steps,
            "rate_qw": self.rate_q / steps,
        }
        if self.probe is not None:
            values["rate_out"] = self.rate_out / steps
        return values


def _relative_change(change: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    return change.norm() / before.norm().clamp_min(1e-30)


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


def confidence_histogram(confidence: torch.Tensor) -> torch.Tensor:
    """(CONF_BINS,) shares of values in [i/10, (i+1)/10); the last bin includes 1.0."""
    inner_edges = torch.arange(1, CONF_BINS, device=confidence.device) / CONF_BINS  # 0.1 .. 0.9
    bins = torch.bucketize(confidence.flatten(), inner_edges.to(confidence.dtype), right=True)
    return torch.bincount(bins, minlength=CONF_BINS).float() / max(confidence.numel(), 1)


def confidence_stats(confidence: torch.Tensor) -> dict[str, torch.Tensor]:
    """conf_mean, conf_low and conf_hist_0 .. conf_hist_9 of a layer's confidences."""
    values = {"conf_mean": confidence.mean(), "conf_low": (confidence < 0.1).float().mean()}
    for i, share in enumerate(confidence_histogram(confidence)):
        values[f"conf_hist_{i}"] = share
    return values


class QuantStatsCollector:
    """Turns the layers' recorded statistics into run-store rows.

    Call `begin(collect)` before each step's forward pass, `after_step()` after the optimizer
    step and, on a statistics step, `rows()` after that.
    """

    def __init__(self, model: nn.Module, enabled: bool) -> None:
        self.layers = quantized_layers(model)
        self.enabled = enabled
        self.windows: dict[str, _Window] = {}
        self.capturing: set[str] = set()  # layers whose next forward input becomes a probe
        self.probes: dict[str, torch.Tensor] = {}
        self.grad_noise = GradNoiseMeter(self.layers) if enabled else None
        if enabled:
            for name, layer in self._weight_layers():
                layer.register_forward_pre_hook(self._probe_hook(name))

    def _weight_layers(self) -> list[tuple[str, QuantLinear]]:
        return [(n, m) for n, m in self.layers.items() if m.config.forward_w is not None]

    def _probe_hook(self, name: str) -> Any:
        # Not traced by torch.compile: a hook per layer name would recompile once per layer.
        @torch.compiler.disable
        def capture(module: nn.Module, args: tuple[Any, ...]) -> None:
            if name in self.capturing:
                x = args[0].detach()
                rows = x.reshape(-1, x.shape[-1])[:PROBE_ROWS]  # (n, in)
                self.probes[name] = rows.to(torch.float32, copy=True)

        return capture

    def begin(self, collect: bool) -> None:
        """Before a step's forward pass: record operand statistics on this step or not."""
        for layer in self.layers.values():
            layer.stats = {} if collect else None
        if self.grad_noise is not None:
            self.grad_noise.begin(collect)
        if self.enabled:  # windows start after this step: the first one, or after a stats step
            names = (name for name, _ in self._weight_layers())
            self.capturing = {n for n in names if collect or n not in self.windows}

    def after_step(self) -> None:
        """After the optimizer step: advance the oscillation windows (only when stats are on)."""
        if not self.enabled:
            return
        for name, layer in self._weight_layers():
            if name not in self.windows:
                self._start_window(name, layer)
            else:
                self.windows[name].update(layer)

    def state_dict(self) -> dict[str, Any]:
        """The open windows, each with its probe (what a resumed run needs to record the same
        statistics); empty when statistics are off. A probe not yet in a window lives only
        within a step."""
        return {name: window.state_dict() for name, window in self.windows.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Reopen the windows of `state_dict()`; layers it does not name start afresh."""
        if not self.enabled:
            return
        layers = dict(self._weight_layers())
        self.windows = {
            name: _Window.restored(window, layers[name].weight.device)
            for name, window in state.items()
            if name in layers
        }

    def _start_window(self, name: str, layer: QuantLinear) -> None:
        self.capturing.discard(name)
        self.windows[name] = _Window(layer, self.probes.pop(name, None))

    def rows(self) -> list[tuple[str, str, str, float]]:
        """(layer, operand, metric, value) rows for this statistics step; resets the windows."""
        rows: list[tuple[str, str, str, float]] = []
        for name, layer in self.layers.items():
            for (operand, metric), value in (layer.stats or {}).items():
                rows.append((name, operand, metric, float(value)))
            layer.stats = None
            window = self.windows.get(name)
            if window is not None and window.steps > 0:
                values = window.summary() | confidence_stats(quant_confidence(layer))
                rows += [(name, "weight", k, float(v)) for k, v in values.items()]
                self._start_window(name, layer)
        if self.grad_noise is not None:
            rows += self.grad_noise.rows()
        return rows
