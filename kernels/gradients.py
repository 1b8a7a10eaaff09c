"""The quantized Linear's gradients in its inputs' dtypes, in one launch.

Under bfloat16 autocast a layer's input, weight and bias are float32 tensors (a LayerNorm's
output, the parameters) that the layer computes with in bfloat16. Its GEMMs give the input and
weight gradients in bfloat16, and autograd then casts each to float32, as the cast's backward
does; the bias gradient (float32 column sums of dY, which the pair kernel leaves as one partial
sum per row tile) is added up, rounded to bfloat16 and cast back. Here all of it is one pass:
each bfloat16 gradient widened to float32 (its 16 bits shifted up: torch's cast, exact, NaN
payloads included) and the bias's partial sums added and rounded to bfloat16 values
(`tile_io.rounded_to_bf16`: torch's rounding), instead of up to six launches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from fp4cli.kernels.launch import launch
from fp4cli.kernels.tile_io import rounded_to_bf16

GRADIENT_BLOCK = 4096  # values a program: 4 warps, 32 a thread
GRADIENT_WARPS = 4
SUM_COLS, SUM_PARTS = 64, 64  # a column-sum program's columns, and partial sums a load


@triton.jit
def _widen_block(halves_ptr, words_ptr, count, start, BLOCK: tl.constexpr):
    """Elements [start, start + BLOCK) of bfloat16 bits (int16) as float32 bits (int32)."""
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < count
    halves = tl.load(halves_ptr + offsets, mask=mask, other=0)
    tl.store(words_ptr + offsets, (halves.to(tl.int32) & 0xFFFF) << 16, mask=mask)


@triton.jit
def _column_sums_block(partial_ptr, out_ptr, cols, parts, start, ROUND: tl.constexpr,
                       COLS: tl.constexpr, PARTS: tl.constexpr):  # fmt: skip
    """Columns [start, start + COLS) of the (cols, parts) float32 partial sums (each column's
    contiguous) added in float32, rounded to bfloat16 values with ROUND, into out (cols,)."""
    col_ids = start + tl.arange(0, COLS)
    col_mask = col_ids < cols
    sums = tl.zeros((COLS,), dtype=tl.float32)
    for first in range(0, parts, PARTS):
        part_ids = first + tl.arange(0, PARTS)
        mask = col_mask[:, None] & (part_ids < parts)[None, :]
        block = tl.load(partial_ptr + col_ids[:, None] * parts + part_ids[None, :], mask=mask,
                        other=0.0)  # fmt: skip
        sums += tl.sum(block, axis=1)
    if ROUND:
        sums = rounded_to_bf16(sums)
    tl.store(out_ptr + col_ids, sums, mask=col_mask)


@triton.jit
def gradients_kernel(
    first_ptr, first_out_ptr, first_count, second_ptr, second_out_ptr, second_count,
    partial_ptr, sums_ptr, cols, parts, BLOCK: tl.constexpr, FIRST: tl.constexpr,
    SECOND: tl.constexpr, SUMS: tl.constexpr, ROUND: tl.constexpr, SUM_COLS: tl.constexpr,
    SUM_PARTS: tl.constexpr,
):  # fmt: skip
    """Programs in three runs: the first tensor widened, the second widened, then the column
    sums finished from their partial sums (each run only where its flag is set; a missing
    run's count is 0)."""
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
            start = (program - widened_programs) * SUM_COLS
            _column_sums_block(partial_ptr, sums_ptr, cols, parts, start, ROUND, SUM_COLS,
                               SUM_PARTS)  # fmt: skip


def widen_gradients(
    gradients: Sequence[torch.Tensor | None],
    partial_sums: torch.Tensor | None = None,
    round_sums: bool = False,
) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
    """(each bfloat16 gradient, at most two, as a new float32 tensor, None staying None; the
    column sums) in one launch. partial_sums (cols, parts) float32: each column's partial sums
    (`launch.ColumnSums`), added in float32 into a new (cols,) float32 tensor, its values
    rounded to bfloat16 with `round_sums`. The bits of `g.float()`, and of
    `sums.to(torch.bfloat16).float()` for the sums (added in an order of the kernel's)."""
    if len(gradients) > 2:
        raise ValueError(f"widen_gradients takes at most two gradients (got {len(gradients)})")
    for gradient in gradients:
        if gradient is not None and gradient.dtype != torch.bfloat16:
            raise ValueError(f"widen_gradients widens bfloat16 gradients (got {gradient.dtype})")
    partial_ok = partial_sums is None or (
        partial_sums.dtype == torch.float32 and partial_sums.dim() == 2
    )
    if not partial_ok:
        raise ValueError("widen_gradients adds (cols, parts) float32 partial sums")
    sources = [g.contiguous() if g is not None else None for g in gradients]
    widened = [torch.empty(g.shape, dtype=torch.float32, device=g.device) if g is not None
               else None for g in sources]  # fmt: skip
    args: list[object] = []
    programs = 0
    for index in range(2):
        source = sources[index] if index < len(sources) else None
        out = widened[index] if index < len(widened) else None
        if source is None or out is None:
            args += [None, None, 0]
            continue
        args += [source.view(torch.int16), out.view(torch.int32), source.numel()]
        programs += triton.cdiv(source.numel(), GRADIENT_BLOCK)
    sums = None
    if partial_sums is not None:
        partial_sums = partial_sums.contiguous()
        cols, parts = partial_sums.shape
        sums = torch.empty(cols, dtype=torch.float32, device=partial_sums.device)
        args += [partial_sums, sums, cols, parts]
        programs += triton.cdiv(cols, SUM_COLS)
    else:
        args += [None, None, 0, 0]
    flags = dict(
        FIRST=args[2] != 0,
        SECOND=args[5] != 0,
        SUMS=sums is not None and sums.numel() > 0,
        ROUND=round_sums,
    )
    if programs:
        launch(gradients_kernel, (programs,), args,
               dict(BLOCK=GRADIENT_BLOCK, SUM_COLS=SUM_COLS, SUM_PARTS=SUM_PARTS, **flags),
               GRADIENT_WARPS)  # fmt: skip
    return widened, sums
