"""A quantized layer's seed for one call: rng_seed + calls * SEED_STRIDE (`function.py` says
how the operands draw from it), where `calls` counts the layer's training calls. Both live on
the layer's device, so a CUDA graph of a step draws a new seed on every replay."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp4cli.linear.function import SEED_STRIDE


def draw_call_seed(rng_seed: torch.Tensor, calls: torch.Tensor, counts: bool) -> torch.Tensor:
    """This call's seed, a tensor of its own; then `count_call`."""
    call_seed = torch.add(rng_seed, calls, alpha=SEED_STRIDE)
    count_call(calls, counts)
    return call_seed


def draw_call_seed_launched(
    rng_seed: torch.Tensor, calls: torch.Tensor, counts: bool
) -> torch.Tensor:
    """`draw_call_seed` in one kernel launch (`kernels.elementwise.call_seed`), the same bits:
    for executors that launch kernels, where two torch operations cost two host steps."""
    from fp4cli.kernels.elementwise.call_seed import launch_call_seed

    return launch_call_seed(rng_seed, calls, SEED_STRIDE, counts)


def start_call_launched(
    rng_seed: torch.Tensor,
    calls: torch.Tensor,
    counts: bool,
    bias: torch.Tensor | None,
    dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the call's seed, as `draw_call_seed_launched` draws it; the bias in `dtype`): where a
    contiguous float32 bias computes in bfloat16 (under autocast), the same launch rounds it,
    with the bits of `bias.to(dtype)`; otherwise the bias is returned as given, for the
    executor to cast."""
    from fp4cli.kernels.elementwise.call_seed import launch_call_start

    rounds = (
        bias is not None
        and dtype == torch.bfloat16
        and bias.dtype == torch.float32
        and bias.dim() == 1
        and bias.is_contiguous()
    )
    start = launch_call_start(rng_seed, calls, SEED_STRIDE, counts, bias if rounds else None)
    return start.seed, start.bias if rounds else bias


def count_call(calls: torch.Tensor, counts: bool) -> None:
    """A call that `counts` (a training call) adds itself to `calls`, in place."""
    if counts:
        calls.add_(1)


@dataclass(frozen=True)
class CallCounter:
    """A layer's `rng_seed` and `calls` buffers, handed to the executor that draws the call's
    seed inside its recorded program (`draw_call_seed_launched`): a program replayed from a
    CUDA graph then draws it with no launch of its own."""

    rng_seed: torch.Tensor
    calls: torch.Tensor
    counts: bool

    def draw(self) -> torch.Tensor:
        """The call's seed, drawn as the recorded programs draw it (a call that is not
        replayed: one tagged for recomputation)."""
        return draw_call_seed_launched(self.rng_seed, self.calls, self.counts)
