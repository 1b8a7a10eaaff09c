"""Q-EMA's update of a layer's weight average in one pass: `fp4cli.techniques.qema.update_ema`
(the definition) as one launch instead of its five torch passes over the weight.

ema = weight where the layer's update count is 0 (COPY_FIRST: an average that starts from the
weight), else fl(fl(ema * beta) + fl(weight * keep))
with keep = 1 - beta (computed in double, as Python computes the reference's `1 - beta`) and both
scalars rounded to float32, as torch rounds a Python scalar for a float32 tensor. The kernel is
compiled without fused multiply-adds, so each product is rounded on its own, as the reference's
separate multiplications round them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch

EMA_BLOCK = 2048  # values a program: 8 warps, 8 a thread
EMA_WARPS = 8


@triton.jit
def ema_update_kernel(ema_ptr, weight_ptr, updates_ptr, beta, keep, n, BLOCK: tl.constexpr,
                      COPY_FIRST: tl.constexpr):  # fmt: skip
    """ema (n,) float32, in place, from weight (n,) (float32 or narrower) and the update count
    (int64 at updates_ptr): the weight itself on the first update when COPY_FIRST, else the
    average step."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    first = (tl.load(updates_ptr) == 0) & COPY_FIRST
    weight = tl.load(weight_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    ema = tl.load(ema_ptr + offsets, mask=mask & ~first, other=0.0)
    stepped = ema * beta + weight * keep
    tl.store(ema_ptr + offsets, tl.where(first, weight, stepped), mask=mask)


def ema_update_supported(ema: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `update_ema_kernel` takes these tensors: float32 ema, a float weight of its
    shape, both contiguous on one device."""
    return (
        ema.dtype == torch.float32
        and weight.is_floating_point()
        and weight.shape == ema.shape
        and weight.device == ema.device
        and ema.is_contiguous()
        and weight.is_contiguous()
    )


def update_ema_kernel(
    ema: torch.Tensor,
    weight: torch.Tensor,
    beta: float,
    updates: torch.Tensor,
    first_copies: bool = True,
) -> None:
    """`update_ema(ema, weight, beta, updates, first_copies)` in one launch
    (`ema_update_supported`)."""
    n = ema.numel()
    args = (ema, weight.detach(), updates, float(beta), 1 - float(beta), n)
    launch(ema_update_kernel, (triton.cdiv(n, EMA_BLOCK),), args,
           dict(BLOCK=EMA_BLOCK, COPY_FIRST=first_copies), num_warps=EMA_WARPS,
           fp_fusion=False)  # fmt: skip
