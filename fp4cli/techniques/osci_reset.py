"""OsciReset (TetraJet-v2, arXiv 2510.27527; its code's `distance_ratio` detection,
olmo/quantization_real/oscillation_reset.py and calibrate.py): weights whose quantized value
moves far more than the weight itself are oscillating across a rounding boundary; they are set
to their quantized value.

From `start_step` on, in every window of `period` steps: after step p * period (steps counted
from 0, each after its optimizer update), each quantized layer's weight W is kept as W_prev;
after each of the next `track_steps` steps, per element, |Q(W) - Q(W_prev)| and |W - W_prev|
are added to two sums and W_prev becomes W; after the step after those, the elements whose
ratio of the sums is at least `threshold` (0 where W did not move) are set to Q(W). Q is the
layer's forward weight quantizer along its input features (seed 0 where it rounds
stochastically, the seed the code passes). The weights change in place between steps; the
optimizer's state is left as it is, as in the code. A layer whose OutControl channels are chosen
when a window begins is watched on its FP4 channels alone, taken in their order, for the whole
window (the code's `fp4_channel_idx`); its FP8 channels are never reset.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from fp4cli.quant import fake_quantize


class OsciResetError(ValueError):
    """A model OsciReset cannot run on; one line."""


class OsciReset:
    """OsciReset over the quantized layers of a model (`fp4cli.recipe_schema.OsciResetConfig`);
    `after_step` after each optimizer step."""

    def __init__(self, model: nn.Module, config: Any) -> None:
        from fp4cli.linear import quantized_layers

        self.config = config
        self.layers = {
            name: layer
            for name, layer in quantized_layers(model).items()
            if layer.config.forward_w is not None
        }
        for name, layer in self.layers.items():
            if layer.config.hadamard("forward") is not None:
                raise OsciResetError(
                    f"optimizer.osci_reset: layer {name} transforms its forward GEMM's "
                    "operands (a Hadamard transform); OsciReset compares weights with their "
                    "quantized values in the weights' own basis"
                )
        self.tracked: dict[str, dict[str, torch.Tensor]] = {}

    def quantized(self, name: str, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Q(W) of a layer: its forward weight quantizer, float32; with `columns` (OutControl's
        FP4 channels) of those columns, in their order."""
        spec = self.layers[name].config.forward_w
        assert spec is not None  # the layers kept have one
        return fake_quantize(self._weight(name, columns), spec, 1, 0, out_dtype=torch.float32)

    def _weight(self, name: str, columns: torch.Tensor | None) -> torch.Tensor:
        weight = self.layers[name].weight.detach().float()
        return weight if columns is None else weight[:, columns]

    @torch.no_grad()
    def after_step(self, step: int) -> float | None:
        """The window's work after step `step` (from 0); the fraction of the weights reset
        where this step resets them, else None."""
        cfg = self.config
        if step < cfg.start_step:
            return None
        phase = step % cfg.period
        if phase == 0:
            self.tracked = {name: self._snapshot(name) for name in self.layers}
        elif not self.tracked:  # the first window has not begun
            return None
        elif phase <= cfg.track_steps:
            for name in self.layers:
                self._track(name)
        elif phase == cfg.track_steps + 1:
            return self._reset()
        return None

    def _snapshot(self, name: str) -> dict[str, torch.Tensor]:
        channels = self.layers[name].out_control_channels()
        columns = None if channels is None else channels[1].clone()
        weight = self._weight(name, columns)
        state = {
            "previous": weight.clone(),
            "previous_quantized": self.quantized(name, columns),
            "weight_moves": torch.zeros_like(weight),
            "quantized_moves": torch.zeros_like(weight),
        }
        return state if columns is None else state | {"columns": columns}

    def _track(self, name: str) -> None:
        state = self.tracked[name]
        columns = state.get("columns")
        weight = self._weight(name, columns)
        quantized = self.quantized(name, columns)
        state["quantized_moves"] += (quantized - state["previous_quantized"]).abs()
        state["weight_moves"] += (weight - state["previous"]).abs()
        state["previous"], state["previous_quantized"] = weight.clone(), quantized

    def _reset(self) -> float:
        reset, total = 0, 0
        for name, layer in self.layers.items():
            state = self.tracked[name]
            moved = state["weight_moves"] > 0
            ratio = torch.where(
                moved, state["quantized_moves"] / torch.where(moved, state["weight_moves"], 1), 0
            )
            mask = ratio >= self.config.threshold
            columns = state.get("columns")
            quantized = self.quantized(name, columns).to(layer.weight.dtype)
            if columns is None:
                layer.weight.data[mask] = quantized[mask]
            else:
                watched = layer.weight.data[:, columns]  # a copy: written back whole
                watched[mask] = quantized[mask]
                layer.weight.data[:, columns] = watched
            reset += int(mask.sum())
            total += mask.numel()
        self.tracked = {}
        return reset / max(total, 1)

    def state_dict(self) -> dict[str, Any]:
        """The window's sums and snapshots (tensors only), for a checkpoint."""
        return {"tracked": {name: dict(state) for name, state in self.tracked.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        tracked = state.get("tracked", {})
        if tracked and set(tracked) != set(self.layers):
            raise OsciResetError(
                "optimizer.osci_reset: the checkpoint's tracked layers are not this model's"
            )
        self.tracked = {name: dict(s) for name, s in tracked.items()}
