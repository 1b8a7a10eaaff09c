"""OutControl (TetraJet-v2, arXiv 2510.27527; its code's NVFP4 + MXFP8 mixed Linear,
olmo/quantization_real/linear_mix.py, scheduled by calibrate.py): the input channels of a linear
layer whose activations have the largest norms are kept in FP8, the rest in the layer's FP4.

Calibration. The layer counts optimizer steps (from 0). After step `record_start` it starts
adding, at every training forward call, each input channel's L2 norm over the call's tokens
(all ranks' sums are added at the end). After step `record_start + record_steps` it sorts the
channels by their sums, largest first (ties keep channel order), and the order is fixed from
then on. The first `fp8_channel_count` channels of the order are the FP8 ones, the rest the
FP4 ones, each group in that order, so FP4's blocks of 16 hold channels of similar norm.

The split. With X = [X_4 | X_8] and W = [W_4 | W_8] (columns in those orders):
forward      Y = Q(X_4) Q(W_4)^T + F(X_8) F(W_8)^T   (Q: forward.x / .w, F: `format`)
grad_input   dX = dY W^ as without OutControl, W^ the forward's mixed weight under double
             quantization (FP4 values on the FP4 channels, FP8 values on the others)
grad_weight  dW_4 = Q5(dY)^T Q6(X^_4) as without OutControl (its Hadamard too);
             dW_8 = F(dY)^T F(X^_8), both blocked along the tokens, no Hadamard
(X^: the forward's mixed activation under double quantization, else X.) The reference
executor computes it (`fp4cli.linear.function`); until the channels are chosen the layer
computes as without OutControl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.quant.spec import QuantSpec, SpecError

if TYPE_CHECKING:
    import torch

# The code's MXFP8: E4M3 elements, an E8M0 scale per 32 values, 2^ceil(log2(amax / 448))
# (cvt.rp to ue8m0), round to nearest even (kernels/csrc/quant_fp8.cu, utils.hpp)
MXFP8 = QuantSpec(element="e4m3", scale="e8m0", block=32, scale_rule="ceil")
FP8_ELEMENTS = ("e4m3", "e5m2")


@dataclass(frozen=True)
class OutControlConfig:
    """ratio: the share of input channels kept in FP8 (`X_top_channels_ratio`); multiple: their
    count is rounded up to a multiple of it (the code's 128); record_start, record_steps: the
    channel norms are summed over the `record_steps` steps after step `record_start`
    (`X_chan_record_start_iter`, `X_chan_record_iters`); format: the FP8 channels' quantizer
    on X and W (forward) and dY and X (grad_weight), or None for high precision."""

    ratio: float = 0.1
    multiple: int = 128
    record_start: int = 501
    record_steps: int = 50
    format: QuantSpec | None = MXFP8

    def __post_init__(self) -> None:
        r = self.ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1:
            raise SpecError(f"ratio: must be in (0, 1] (got {r!r})")
        for name, least in (("multiple", 1), ("record_start", 0), ("record_steps", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise SpecError(f"{name}: must be an integer of at least {least} (got {value!r})")
        fmt = self.format
        if fmt is not None and not isinstance(fmt, QuantSpec):
            raise SpecError(f"format: must be a QuantSpec or null (got {fmt!r})")
        if fmt is not None and fmt.element not in FP8_ELEMENTS:
            raise SpecError(
                f"format: an FP8 element ({', '.join(FP8_ELEMENTS)}) or null (got {fmt.element!r})"
            )

    @property
    def select_after(self) -> int:
        """The step (from 0) after which the channels are chosen."""
        return self.record_start + self.record_steps


def fp8_channel_count(in_features: int, config: OutControlConfig) -> int:
    """How many input channels stay in FP8, as the code counts them (linear_mix.py:63-64):
    int(in_features * ratio) rounded up to a multiple, at most in_features rounded down to
    one. 0 leaves the layer unsplit; in_features keeps every channel in FP8."""
    m = config.multiple
    return min(in_features // m * m, (int(in_features * config.ratio) + m - 1) // m * m)


def phase(steps_done: int, config: OutControlConfig) -> str:
    """The layer's phase after `steps_done` optimizer steps: "before" the recording,
    "recording" (its forward calls add channel norms) or "split" (the channels are chosen)."""
    if steps_done <= config.record_start:
        return "before"
    return "recording" if steps_done <= config.select_after else "split"


def record_norms(norms: torch.Tensor, x: torch.Tensor) -> None:
    """Add each input channel's L2 norm over the tokens of x (..., in) to `norms` (in,),
    computed in x's dtype, as the code does."""
    norms += x.detach().reshape(-1, x.shape[-1]).norm(p=2, dim=0)


def channel_order(norms: torch.Tensor) -> torch.Tensor:
    """The input channels by their summed norms, largest first (a stable sort: the code's
    argsort is not); in a distributed run every rank's sums are added first, in place."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(norms, op=dist.ReduceOp.SUM)
    return torch.argsort(norms, descending=True, stable=True)


def split_channels(order: torch.Tensor, fp8_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the FP8 channels, the FP4 channels), each in the order's order."""
    return order[:fp8_count], order[fp8_count:]
