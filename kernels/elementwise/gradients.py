"""The quantized Linear's gradients in its inputs' dtypes, in one launch.

Under bfloat16 autocast a layer's input, weight and bias are float32 tensors (a LayerNorm's
output, the parameters) that the layer computes with in bfloat16. Its GEMMs give the input and
weight gradients in bfloat16, and autograd then casts each to float32, as the cast's backward
does; the bias gradient (float32 column sums of dY) is rounded to bfloat16 and cast back. Here
all of it is one pass: each bfloat16 gradient widened to float32 (its 16 bits shifted up:
torch's cast, exact, NaN payloads included), and the bias gradient added up from the partial
column sums the pair kernel left (`tiling.ColumnSums`) and rounded to bfloat16
(`tile_io.rounded_to_bf16`: torch's rounding), instead of up to six launches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.host.tiling import ColumnSums
from fp4cli.kernels.tiles.tile_io import rounded_to_bf16
from fp4cli.kernels.tiles.tile_ops import add

GRADIENT_BLOCK = 4096  # values a program: 4 warps, 32 a thread
GRADIENT_WARPS = 4
SUM_COLUMNS, SUM_TILES = 32, 32  # a program's columns of the sums, and tiles a step


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
def _column_totals(partials_ptr, columns, count, tiles, COLUMNS: tl.constexpr,
                   TILES: tl.constexpr):  # fmt: skip
    """The float32 sum of each column's `tiles` partial sums (contiguous at
    partials_ptr + column * tiles): TILES of them at a time, each step's added in a tree and
    onto the running total. Missing terms are -0.0, which leaves every sum as it is (made from
    its bits: a -0.0 constant may become +0.0)."""
    sign_bit = tl.full((COLUMNS,), 0x80000000, tl.uint32)
    total = sign_bit.to(tl.float32, bitcast=True)  # -0.0
    negative_zero = tl.broadcast_to(total[:, None], (COLUMNS, TILES))
    rows = columns.to(tl.int64)[:, None] * tiles
    for first in range(0, tiles, TILES):
        tile = first + tl.arange(0, TILES)[None, :]
        mask = (columns < count)[:, None] & (tile < tiles)
        terms = tl.where(mask, tl.load(partials_ptr + rows + tile, mask=mask), negative_zero)
        total = total + tl.reduce(terms, 1, add)
    return total


@triton.jit
def gradients_kernel(
    first_ptr, first_out_ptr, first_count, second_ptr, second_out_ptr, second_count,
    partials_ptr, sums_ptr, sums_count, tiles, BLOCK: tl.constexpr, FIRST: tl.constexpr,
    SECOND: tl.constexpr, SUMS: tl.constexpr, ROUND: tl.constexpr, SUM_COLUMNS: tl.constexpr,
    SUM_TILES: tl.constexpr,
):  # fmt: skip
    """Programs in three runs: the first tensor widened, the second widened, then the column
    sums added up from their partials, rounded to bfloat16 where ROUND (each run only where its
    flag is set; a missing run's count is 0)."""
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
            columns = (program - widened_programs) * SUM_COLUMNS + tl.arange(0, SUM_COLUMNS)
            total = _column_totals(partials_ptr, columns, sums_count, tiles, SUM_COLUMNS,
                                   SUM_TILES)  # fmt: skip
            if ROUND:
                total = rounded_to_bf16(total)
            tl.store(sums_ptr + columns, total, mask=columns < sums_count)


class Widened(NamedTuple):
    """What `widen_gradients` returns: the gradients (None where none was given) and the
    column sums' totals (None without them)."""

    gradients: list[torch.Tensor | None]
    sums: torch.Tensor | None


def widen_gradients(
    gradients: Sequence[torch.Tensor | None],
    sums: ColumnSums | None = None,
    round_sums: bool = True,
) -> Widened:
    """Each bfloat16 gradient (at most two; None stays None) as a new float32 tensor, and the
    totals of `sums`' partials (float32, contiguous) as a new float32 tensor, rounded to
    bfloat16 values where `round_sums`, in one launch: the bits of `g.float()` and of
    `total.to(torch.bfloat16).float()`. Each total adds its column's partials in a fixed order
    (`_column_totals`), so every call gives the same bits."""
    if len(gradients) > 2:
        raise ValueError(f"widen_gradients takes at most two gradients (got {len(gradients)})")
    for gradient in gradients:
        if gradient is not None and gradient.dtype != torch.bfloat16:
            raise ValueError(f"widen_gradients widens bfloat16 gradients (got {gradient.dtype})")
    partials = sums.partials if sums is not None else None
    if sums is not None and (
        partials is None or partials.dtype != torch.float32 or not partials.is_contiguous()
    ):
        raise ValueError("widen_gradients adds contiguous float32 partial sums")
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
    totals = None
    if sums is not None and partials is not None:
        totals = torch.empty(sums.cols, dtype=torch.float32, device=partials.device)
        args += [partials, totals, sums.cols, sums.tiles]
        programs += triton.cdiv(sums.cols, SUM_COLUMNS)
    else:
        args += [None, None, 0, 0]
    flags = dict(
        FIRST=args[2] != 0, SECOND=args[5] != 0, SUMS=totals is not None and totals.numel() > 0,
        ROUND=round_sums, SUM_COLUMNS=SUM_COLUMNS, SUM_TILES=SUM_TILES,
    )  # fmt: skip
    if programs:
        launch(gradients_kernel, (programs,), args, dict(BLOCK=GRADIENT_BLOCK, **flags),
               num_warps=GRADIENT_WARPS)  # fmt: skip
    return Widened(widened[: len(gradients)], totals)
