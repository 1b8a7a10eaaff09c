"""The quantized Linear's gradients in its inputs' dtypes, in one launch.

Under bfloat16 autocast a layer's input, weight and bias are float32 tensors (a LayerNorm's
output, the parameters) that the layer computes with in bfloat16. Its GEMMs give the input and
weight gradients in bfloat16, and autograd then casts each to float32, as the cast's backward
does; the bias gradient (float32 column sums of dY) is rounded to bfloat16 and cast back. Here
all of it is one pass: each bfloat16 gradient widened to float32 (its 16 bits shifted up:
torch's cast, exact, NaN payloads included) and the bias sums rounded to bfloat16 in place
(`tile_io.rounded_to_bf16`: torch's rounding), instead of up to five launches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.tiles.tile_io import rounded_to_bf16

GRADIENT_BLOCK = 4096  # values a program: 4 warps, 32 a thread
GRADIENT_WARPS = 4


@triton.jit
def _widen_block(halves_ptr, words_ptr, count, start, BLOCK: tl.constexpr):
    """Elements [start, start + BLOCK) of a bfloat16 tensor widened into a float32 one, as
    bits: each read as int16 and written as int32 (pointers recast here, not views on the
    host: each view is a host step of a replayed program)."""
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < count
    halves = tl.load(halves_ptr.to(tl.pointer_type(tl.int16)) + offsets, mask=mask, other=0)
    words = (halves.to(tl.int32) & 0xFFFF) << 16
    tl.store(words_ptr.to(tl.pointer_type(tl.int32)) + offsets, words, mask=mask)


@triton.jit
def gradients_kernel(
    first_ptr, first_out_ptr, first_count, second_ptr, second_out_ptr, second_count,
    sums_ptr, sums_count, BLOCK: tl.constexpr, FIRST: tl.constexpr, SECOND: tl.constexpr,
    SUMS: tl.constexpr,
):  # fmt: skip
    """Programs in three runs: the first tensor widened, the second widened, then the float32
    sums rounded to bfloat16 in place (each run only where its flag is set; a missing run's
    count is 0)."""
    program = tl.program_id(0).to(tl.int64)
    first_programs = tl.cdiv(first_count, BLOCK)
    widened_programs = first_programs + tl.cdiv(second_count, BLOCK)
    if FIRST:  # noqa: SIM102  (a constexpr test: the run's code only where it is set)
        if program < first_programs:
            _widen_block(first_ptr, first_out_ptr, first_count, program * BLOCK, BLOCK)
    if SECOND:  # noqa: SIM102
        if (program >= first_programs) & (program < widened_programs):
            start = (program - first_programs) * BLOCK
            _widen_block(second_ptr, second_out_ptr, second_count, start, BLOCK)
    if SUMS:  # noqa: SIM102
        if program >= widened_programs:
            offsets = (program - widened_programs) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < sums_count
            sums = tl.load(sums_ptr + offsets, mask=mask, other=0.0)
            tl.store(sums_ptr + offsets, rounded_to_bf16(sums), mask=mask)


def widen_gradients(
    gradients: Sequence[torch.Tensor | None], sums: torch.Tensor | None = None
) -> list[torch.Tensor | None]:
    """Each bfloat16 gradient (at most two; None stays None) as a new float32 tensor, and
    `sums` (float32, contiguous) rounded to bfloat16 values in place, in one launch: the bits of
    `g.float()` and of `sums.to(torch.bfloat16).float()`."""
    if len(gradients) > 2:
        raise ValueError(f"widen_gradients takes at most two gradients (got {len(gradients)})")
    for gradient in gradients:
        if gradient is not None and gradient.dtype != torch.bfloat16:
            raise ValueError(f"widen_gradients widens bfloat16 gradients (got {gradient.dtype})")
    if sums is not None and (sums.dtype != torch.float32 or not sums.is_contiguous()):
        raise ValueError("widen_gradients rounds contiguous float32 sums")
    sources = [g.contiguous() if g is not None else None for g in gradients]
    sources += [None] * (2 - len(sources))
    widened: list[torch.Tensor | None] = []
    args: list[object] = []
    programs = 0
    for source in sources:
        if source is None:
            widened.append(None)
            args += [None, None, 0]
            continue
        out = torch.empty(source.shape, dtype=torch.float32, device=source.device)
        widened.append(out)
        args += [source, out, source.numel()]
        programs += triton.cdiv(source.numel(), GRADIENT_BLOCK)
    args += [sums, 0 if sums is None else sums.numel()]
    if sums is not None:
        programs += triton.cdiv(sums.numel(), GRADIENT_BLOCK)
    flags = dict(
        FIRST=args[2] != 0, SECOND=args[5] != 0, SUMS=sums is not None and sums.numel() > 0
    )
    if programs:
        launch(gradients_kernel, (programs,), args, dict(BLOCK=GRADIENT_BLOCK, **flags),
               num_warps=GRADIENT_WARPS)  # fmt: skip
    return widened[: len(gradients)]
