"""OutControl in a QuantLinear: the layer's buffers, its schedule on the host, and the guard
against a CUDA graph captured before the channels are chosen. What it computes is in
`fp4cli.techniques.out_control`; the split GEMMs are the reference executor's
(`fp4cli.linear.function`).

The buffers live on the layer, so they go into its state dict: `out_control_steps` (optimizer
steps counted), `channel_norms` (the summed input norms, float32) and `channel_order` (the
chosen order; the identity until then). The step count and phase are kept on the host too, so
a call reads no device value; they are read back from the buffer whenever a state dict is
loaded. Under torch.compile the phase is a host value that the compiled code is specialized
on: a model compiles again when it changes (twice in a run).
"""

from __future__ import annotations

from typing import Any

import torch

from fp4cli.quant import QuantSpec, fake_quantize
from fp4cli.techniques import out_control as oc


class LayerSchedule:
    """OutControl's state in one QuantLinear (`layer`): how many channels stay in FP8,
    the optimizer steps done and the phase they put the layer in."""

    def __init__(self, layer: Any, config: oc.OutControlConfig) -> None:
        self.config = config
        self.fp8_count = oc.fp8_channel_count(layer.in_features, config)
        device, features = layer.weight.device, layer.in_features
        layer.register_buffer(
            "out_control_steps", torch.zeros((), dtype=torch.int64, device=device)
        )
        layer.register_buffer("channel_norms", torch.zeros(features, device=device))
        layer.register_buffer("channel_order", torch.arange(features, device=device))
        layer.register_load_state_dict_post_hook(_reread)
        self.at(0)

    def at(self, steps_done: int) -> None:
        self.steps_done = steps_done
        self.phase = oc.phase(steps_done, self.config)

    def before_call(self, layer: Any, x: torch.Tensor) -> None:
        """Add x's channel norms while recording (training calls only)."""
        if self.phase == "recording" and layer.training:
            oc.record_norms(layer.channel_norms, x)
        if not torch.compiler.is_compiling() and x.is_cuda:
            self.refuse_capture()

    def channels(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(FP8 channels, FP4 channels) once chosen, else None (also when none stays in FP8)."""
        if self.phase != "split" or self.fp8_count == 0:
            return None
        return oc.split_channels(layer.channel_order, self.fp8_count)

    @torch.no_grad()
    def advance(self, layer: Any) -> None:
        """One optimizer step: after step `record_start + record_steps` the channels are
        chosen; nothing changes once they are."""
        if self.phase == "split":
            return
        if layer.channel_norms.is_cuda:
            self.refuse_capture()
        if self.steps_done == self.config.select_after:
            layer.channel_order.copy_(oc.channel_order(layer.channel_norms))
        layer.out_control_steps.fill_(self.steps_done + 1)
        self.at(self.steps_done + 1)

    def refuse_capture(self) -> None:
        """A CUDA graph captured before the channels are chosen would replay the old GEMMs
        and never advance the schedule (it counts on the host): its capture fails, and a
        training run says so and steps eagerly."""
        if self.phase != "split" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"OutControl chooses its FP8 channels after step {self.config.select_after}; "
                "a CUDA graph captured before then would keep the old GEMMs"
            )


def split_weight(
    weight: torch.Tensor,
    channels: tuple[torch.Tensor, torch.Tensor],
    specs: tuple[QuantSpec | None, QuantSpec | None],
    guide: torch.Tensor | None,
    backend: str,
) -> torch.Tensor:
    """A split layer's quantized weight (out, in): the FP8 channels' columns by specs[0]
    (OutControl's format), the FP4 channels' by specs[1] (forward.w, Q-EMA's guide on
    them), each group in the channels' order, seed 0; None leaves columns as they are."""
    quantized = weight.clone()
    for fp4, columns, spec in zip((False, True), channels, specs, strict=True):
        if spec is None or not columns.numel():
            continue
        part_guide = guide[:, columns] if fp4 and guide is not None else None
        part_backend = backend if fp4 else "auto"  # the kernels take no FP8 elements
        quantized[:, columns] = fake_quantize(
            weight[:, columns], spec, seed=0, guide=part_guide, backend=part_backend
        ).to(weight.dtype)
    return quantized


def _reread(layer: Any, _incompatible: Any) -> None:
    """After a state dict is loaded: the step count and phase from the layer's buffer."""
    layer._out_control.at(int(layer.out_control_steps.item()))
