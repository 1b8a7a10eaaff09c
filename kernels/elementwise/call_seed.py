"""What a quantized layer's call starts with, in one launch: its seed, rng_seed + calls * stride,
with the call counted (`calls` + 1) where it counts, and, under bfloat16 autocast, its float32
bias rounded to bfloat16. The seed's definition is `fp4cli.linear.seeds.draw_call_seed` (two
torch operations, each a launch and a host step of its own), the bias's `bias.to(bfloat16)` (a
host step too); here they are one kernel, with the same int64 arithmetic (wrapping as torch's
does) and torch's rounding (`tile_io.rounded_to_bf16`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.tiles.tile_io import rounded_to_bf16

BIAS_BLOCK = 1024  # bias values a program rounds


@triton.jit
def call_seed_kernel(rng_seed_ptr, calls_ptr, seed_ptr, bias_ptr, bias_out_ptr, bias_count,
                     STRIDE: tl.constexpr, COUNTS: tl.constexpr, BIAS: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
    """Program 0: seed = rng_seed + calls * STRIDE; then, where COUNTS, calls + 1 into calls.
    Where BIAS, each program rounds BLOCK values of the float32 bias to bfloat16 into
    bias_out."""
    program = tl.program_id(0)
    if program == 0:
        calls = tl.load(calls_ptr)
        tl.store(seed_ptr, tl.load(rng_seed_ptr) + calls * STRIDE)
        if COUNTS:
            tl.store(calls_ptr, calls + 1)
    if BIAS:
        offsets = program * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < bias_count
        bias = tl.load(bias_ptr + offsets, mask=mask, other=0.0)
        # the rounded value's upper half as the bfloat16's bits (the interpreter's own cast
        # misses subnormals); a NaN as torch's CPU cast writes it
        halves = rounded_to_bf16(bias).to(tl.int32, bitcast=True) >> 16
        halves = tl.where(bias != bias, 0x7FC0, halves)
        tl.store(bias_out_ptr.to(tl.pointer_type(tl.int16)) + offsets, halves.to(tl.int16),
                 mask=mask)  # fmt: skip


class CallStart(NamedTuple):
    """What `launch_call_start` returns: the call's seed (a new 0-dim int64 tensor) and the
    bias rounded to bfloat16 (None where none was given)."""

    seed: torch.Tensor
    bias: torch.Tensor | None


def launch_call_start(
    rng_seed: torch.Tensor,
    calls: torch.Tensor,
    stride: int,
    counts: bool,
    bias: torch.Tensor | None = None,
) -> CallStart:
    """The call's seed from the layer's 0-dim int64 `rng_seed` and `calls`, counting the call
    in `calls` where `counts`; and a contiguous 1-D float32 `bias` rounded to bfloat16 (the
    bits of `bias.to(torch.bfloat16)`; NaN stays NaN), in the same launch."""
    for name, tensor in (("rng_seed", rng_seed), ("calls", calls)):
        if tensor.dtype != torch.int64 or tensor.dim() != 0:
            raise ValueError(f"launch_call_start: {name} must be a 0-dim int64 tensor")
    if bias is not None and (
        bias.dtype != torch.float32 or bias.dim() != 1 or not bias.is_contiguous()
    ):
        raise ValueError("launch_call_start: the bias must be a contiguous 1-D float32 tensor")
    seed = torch.empty((), dtype=torch.int64, device=rng_seed.device)
    rounded, count = None, 0
    if bias is not None:
        rounded = torch.empty(bias.shape, dtype=torch.bfloat16, device=bias.device)
        count = bias.numel()
    launch(
        call_seed_kernel, (max(1, triton.cdiv(count, BIAS_BLOCK)),),
        [rng_seed, calls, seed, bias, rounded, count],
        dict(STRIDE=stride, COUNTS=counts, BIAS=count > 0, BLOCK=BIAS_BLOCK),
        num_warps=1 if count <= 256 else 4, written=(1,) if counts else (),
    )  # fmt: skip
    return CallStart(seed, rounded)


def launch_call_seed(
    rng_seed: torch.Tensor, calls: torch.Tensor, stride: int, counts: bool
) -> torch.Tensor:
    """The call's seed alone (`launch_call_start` without a bias)."""
    return launch_call_start(rng_seed, calls, stride, counts).seed
