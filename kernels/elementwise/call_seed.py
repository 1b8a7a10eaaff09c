"""A quantized layer's call seed drawn in one launch: rng_seed + calls * stride, and the call
counted (`calls` + 1) where it counts. The definition is `fp4cli.linear.seeds.draw_call_seed`
(two torch operations, each a launch and a host step of its own); here both are one kernel of
one program, with the same int64 arithmetic (wrapping as torch's does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch


@triton.jit
def call_seed_kernel(rng_seed_ptr, calls_ptr, seed_ptr, STRIDE: tl.constexpr,
                     COUNTS: tl.constexpr):  # fmt: skip
    """seed = rng_seed + calls * STRIDE; then, where COUNTS, calls + 1 into calls."""
    calls = tl.load(calls_ptr)
    tl.store(seed_ptr, tl.load(rng_seed_ptr) + calls * STRIDE)
    if COUNTS:
        tl.store(calls_ptr, calls + 1)


def launch_call_seed(
    rng_seed: torch.Tensor, calls: torch.Tensor, stride: int, counts: bool
) -> torch.Tensor:
    """The call's seed (a new 0-dim int64 tensor) from the layer's 0-dim int64 `rng_seed` and
    `calls`, counting the call in `calls` where `counts`."""
    for name, tensor in (("rng_seed", rng_seed), ("calls", calls)):
        if tensor.dtype != torch.int64 or tensor.dim() != 0:
            raise ValueError(f"launch_call_seed: {name} must be a 0-dim int64 tensor")
    seed = torch.empty((), dtype=torch.int64, device=rng_seed.device)
    launch(call_seed_kernel, (1,), [rng_seed, calls, seed], dict(STRIDE=stride, COUNTS=counts),
           num_warps=1, written=(1,) if counts else ())  # fmt: skip
    return seed
