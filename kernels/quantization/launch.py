"""Python side of the quantization kernels: shapes, tiles, seeds and launches.

`quantize_e2m1` and `dequantize_e2m1` take and return exactly what the reference
`fp4cli.quant.quantize` works with (codes and scales in the axis-last padded layout, a 0-d
tensor scale), so `fp4cli.quant` can hand a call to either backend.

Called on their own, the launchers run eagerly under torch.compile (a graph break): traced into
a compiled backward pass, the kernels gave wrong gradients, while eager calls match the
reference bit for bit. The quantized Linear's executors reach a compiled model as custom ops
instead (`fp4cli.linear.ops`), whose fake implementations run these launchers under
`shapes_only`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.host.seeds import _seed_args, hadamard_constants, signs_constant
from fp4cli.kernels.host.spec_constants import (
    _scale_constants,
    outer_constants,
    spec_constants,
    table_constants,
    two_level_constants,
)
from fp4cli.kernels.host.tiling import pow2_at_least
from fp4cli.kernels.quantization.dequantize import dequantize_kernel
from fp4cli.kernels.quantization.quantize import quantize_kernel
from fp4cli.kernels.tensor_scale.amax import amax_kernel
from fp4cli.kernels.tensor_scale.encode_table import encode_table_kernel
from fp4cli.kernels.tiles.prescale import prescale_constants
from fp4cli.kernels.tiles.tile_io import GRID_Y
from fp4cli.kernels.tiles.two_level import ENCODE_TABLE
from fp4cli.quant.blocking import round_up, transformed_length
from fp4cli.quant.random_bits import Seed
from fp4cli.quant.spec import QuantSpec
from fp4cli.techniques.hadamard import FixedSigns


@dataclass(frozen=True)
class Tile:
    """A program's tile: `rows` lines by `cols` positions along the axis, and its warps."""

    rows: int
    cols: int
    warps: int = 4


@dataclass(frozen=True)
class AxisView:
    """The input seen as (outer, length, inner) around the quantization axis."""

    outer: int
    length: int
    inner: int

    @classmethod
    def of(cls, shape: torch.Size | tuple[int, ...], axis: int) -> AxisView:
        return cls(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))

    @property
    def transposed(self) -> bool:
        return self.inner > 1


# The pair kernel's smallest tile (`launch_pair.pair_tile`): whole blocks of 32 down its 32 rows,
# and 64 positions (128 bytes of a 16-bit input) along each row; a direction's block or Hadamard
# size, or a 2-D square, can widen it. On an H100, 32 x 64 was the fastest of 32 or 64 rows by 64
# or 128 columns, at 2, 4 or 8 warps (and with programs looping over several tiles), over the
# pairs of the GPT-2-small layers.
PAIR_TILE_ROWS, PAIR_TILE_COLS = 32, 64


def choose_tile(
    view: AxisView,
    padded_length: int,
    block: int,
    hadamard: int | None,
    row_warps: int = 4,
    outer: int = 0,
) -> Tile:
    """A tile holding whole blocks, whole Hadamard blocks and whole outer blocks (`outer`
    positions): about 4K elements, or along the last axis 1K per warp of `row_warps`."""
    least = max(block, hadamard or 1, 8, outer)
    if view.transposed:
        cols = max(least, min(64, pow2_at_least(padded_length)))
        rows = max(4, min(64, pow2_at_least(view.inner), 4096 // cols))
        return Tile(rows, cols, 4)
    cols = max(least, min(1024, pow2_at_least(padded_length)))
    rows = max(1, min(pow2_at_least(view.outer), 1024 * row_warps // cols))
    return Tile(rows, cols, row_warps)


QUANTIZE_ROW_WARPS = 2  # rows of 2 x 1024 (bf16 on an H100: 0.855x the copy, 4 warps 0.831x)
# two-level specs, reading their encode table: a row of 1024 a program (8192 x 8192 bf16 nvfp4
# on an H100: 0.805x the copy, 2 x 1024 at 2 warps 0.779x; see docs/benchmarks.md)
TWO_LEVEL_ROW_WARPS = 1


def _grid(view: AxisView, tile: Tile, padded_length: int) -> tuple[tuple[int, ...], int]:
    """(launch grid, tiles along the axis): `tile_io.tile_origin`'s."""
    along = -(-padded_length // tile.cols)
    if view.transposed:
        return (view.outer * along * -(-view.inner // tile.rows),), along
    most = int(GRID_Y.value)
    return (-(-view.outer // tile.rows), min(along, most), -(-along // most)), along


def group_side(spec: QuantSpec) -> int:
    """The values along the axis a tile must hold whole: an outer block's, an MS-EDEN group's
    (0: neither)."""
    return max(spec.outer_block, spec.eden_group if spec.rounding == "eden" else 0)


def sr_group(spec: QuantSpec) -> int:
    """The elements one Philox call serves (`tile_io.sr_bits`): 4 with 24 bits a value, 128 /
    sr_bits with 8 or 16. A tile draws one call per group along its contiguous dimension where
    that dimension and the tile's side along it are multiples of the group."""
    return 4 if spec.sr_bits == 24 else 128 // spec.sr_bits


def outer_count(padded_length: int, spec: QuantSpec) -> int:
    """Outer blocks along a line of `padded_length` quantized positions."""
    return -(-padded_length // spec.outer_block)


def per_block_amax(outer_amax: torch.Tensor, spec: QuantSpec, n_blocks: int) -> torch.Tensor:
    """(..., outer blocks) amaxes as the reference keeps them: one per block (..., n_blocks)."""
    per_outer = spec.outer_block // int(spec.block)
    return outer_amax.repeat_interleave(per_outer, dim=-1)[..., :n_blocks]


def per_outer_amax(t_amax: torch.Tensor, spec: QuantSpec, padded_length: int) -> torch.Tensor:
    """An outer-block spec's amaxes one per outer block (..., outer blocks), given that or
    one per block (`per_block_amax`)."""
    n_outer = outer_count(padded_length, spec)
    if t_amax.shape[-1] != n_outer:
        t_amax = t_amax[..., :: spec.outer_block // int(spec.block)]
    return t_amax.contiguous()


def same_tables(a: QuantSpec, b: QuantSpec) -> bool:
    """Whether tensors under these two two-level specs get their encode tables from one
    formula (one launch makes both)."""
    return table_constants(a) == table_constants(b)


def encode_tables(
    amax: torch.Tensor, spec: QuantSpec, partials: torch.Tensor | None = None
) -> torch.Tensor:
    """(n, ENCODE_TABLE) float32: the encode table (`encode_table.encode_table_kernel`) of each of
    the n tensor amaxes in `amax` (float32, n elements) under `spec`'s two-level scaling, from
    one launch. partials (n, programs): an amax pass's partial maxima (`amax.store_partial`),
    reduced in that launch into `amax` (then an output)."""
    if amax.dim() != 1:  # a reshape is a host step of a replayed program even where it is idle
        amax = amax.reshape(-1)
    tables = torch.empty(
        (amax.numel(), ENCODE_TABLE.value), dtype=torch.float32, device=amax.device
    )
    if partials is not None and (partials.shape[0] != amax.numel() or not partials.is_contiguous()):
        raise ValueError("partial maxima must be contiguous, a row per tensor amax")
    count = 0 if partials is None else partials.shape[-1]
    write_tables(amax, tables, spec, amax.numel(), partials, count)
    return tables


def write_tables(
    amax: torch.Tensor,
    tables: torch.Tensor,
    spec: QuantSpec,
    tensors: int,
    partials: torch.Tensor | None = None,
    count: int = 0,
) -> None:
    """The encode tables of `tensors` tensor amaxes under `spec`, from one launch: the amaxes
    lie one after another from `amax`'s first element, the tables ENCODE_TABLE entries apart
    from `tables`' first. With `partials`, `count` partial maxima a tensor, one tensor's after
    another, reduced first into the amaxes."""
    launch(
        encode_table_kernel, (tensors,),
        (amax, tables, amax if partials is None else partials, count),
        dict(REDUCE=partials is not None, **table_constants(spec)), num_warps=4,
    )  # fmt: skip


@torch.compiler.disable
def tensor_amax(
    x: torch.Tensor,
    axis: int,
    hadamard: int | None,
    hadamard_seed: Seed | FixedSigns,
    tile: Tile | None = None,
) -> torch.Tensor:
    """The largest finite |x| (of the Hadamard-transformed x, if any), a 1-element tensor."""
    return reduced_partials(amax_partials(x, axis, hadamard, hadamard_seed, tile))


def reduced_partials(partials: torch.Tensor) -> torch.Tensor:
    """The amaxes of an amax pass's (directions, programs) partial maxima, by torch (0 where the
    pass had no programs)."""
    return partials.amax(1) if partials.numel() else partials.new_zeros(partials.shape[0])


def amax_partials(
    x: torch.Tensor,
    axis: int,
    hadamard: int | None,
    hadamard_seed: Seed | FixedSigns,
    tile: Tile | None = None,
) -> torch.Tensor:
    """`tensor_amax`'s partial maxima, (1, programs) float32 (`amax.store_partial`)."""
    view = AxisView.of(x.shape, axis)
    out_length = transformed_length(view.length, hadamard)
    tile = tile or choose_tile(view, out_length, 8, hadamard)
    grid, along = _grid(view, tile, out_length)
    partials = torch.empty((1, math.prod(grid)), dtype=torch.float32, device=x.device)
    seed_ptr, seed_value, from_ptr = _seed_args(hadamard_seed, x.device)
    launch(
        amax_kernel, grid,
        (x, partials, seed_ptr, seed_value, view.outer, view.length, view.inner, along),
        dict(ROWS=tile.rows, COLS=tile.cols, TRANSPOSED=view.transposed,
             SEED_FROM_PTR=from_ptr,
             **hadamard_constants(hadamard, signs_constant(hadamard_seed))),
        num_warps=tile.warps,
    )  # fmt: skip
    return partials


@torch.compiler.disable
def quantize_e2m1(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    seed: Seed | None,
    hadamard: int | None = None,
    hadamard_seed: Seed | FixedSigns = 0,
    values_dtype: torch.dtype | None = None,
    tile: Tile | None = None,
    guide: torch.Tensor | None = None,
    t_amax: torch.Tensor | None = None,
    signed_zero: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(codes, scales, tensor amax, values) of x quantized along `axis` (non-negative).

    With `values_dtype`, only the dequantized values are written (the fake-quantization path)
    and codes and scales are None; otherwise values is None. With `hadamard`, x is first
    transformed along the axis (zero-padded to whole Hadamard blocks). With `guide` (x's shape),
    each value rounds toward it (Q-EMA) instead of by the spec's rounding. `t_amax`: a
    two-level spec's tensor amax when the caller has it (else one pass reduces it first).
    `signed_zero`: a negative value rounded to zero is written as code 8 (-0), as
    `fp4cli.quant.quantize` says."""
    x = x.contiguous()
    if guide is not None:
        guide = guide.contiguous()
    view = AxisView.of(x.shape, axis)
    block = int(spec.block)
    out_length = transformed_length(view.length, hadamard)
    padded = round_up(out_length, block)
    row_warps = TWO_LEVEL_ROW_WARPS if spec.tensor_scale else QUANTIZE_ROW_WARPS
    tile = tile or choose_tile(view, padded, block, hadamard, row_warps, group_side(spec))
    grid, along = _grid(view, tile, padded)
    lead = [*x.shape[:axis], *x.shape[axis + 1 :]]
    table = None
    if not spec.tensor_scale:
        t_amax = None
    elif spec.outer_block:  # found in the tiles, written with the codes
        t_amax = None
        if values_dtype is None:
            outer = outer_count(padded, spec)
            t_amax = torch.empty([*lead, outer], dtype=torch.float32, device=x.device)
    else:
        if t_amax is None:  # reduced by the table's launch
            partials = amax_partials(x, axis, hadamard, hadamard_seed)
            reduced = torch.empty(1, dtype=torch.float32, device=x.device)
            table = encode_tables(reduced, spec, partials)
            t_amax = reduced[0]
        else:
            table = encode_tables(t_amax, spec)
    codes = scales = values = None
    if values_dtype is not None:
        out_shape = [*x.shape[:axis], out_length, *x.shape[axis + 1 :]]
        values = torch.empty(out_shape, dtype=values_dtype, device=x.device)
    else:
        codes = torch.empty([*lead, padded // 2], dtype=torch.uint8, device=x.device)
        scales = torch.empty([*lead, padded // block], dtype=torch.uint8, device=x.device)
    seed_ptr, seed_value, seed_from_ptr = _seed_args(seed, x.device)
    rht_ptr, rht_value, rht_from_ptr = _seed_args(hadamard_seed, x.device)
    # One Philox call per group of elements (`sr_group`) along the contiguous dimension
    contiguous = view.inner if view.transposed else out_length
    group = sr_group(spec)
    side = tile.rows if view.transposed else tile.cols
    grouped = contiguous % group == 0 and side % group == 0
    launch(
        quantize_kernel, grid,
        (x, guide, codes, scales, values, t_amax, table, seed_ptr, seed_value, rht_ptr, rht_value,
         view.outer, view.length, view.inner, out_length, padded, along),
        dict(ROWS=tile.rows, COLS=tile.cols, TRANSPOSED=view.transposed, GROUPED=grouped,
             SEED_FROM_PTR=seed_from_ptr, RHT_SEED_FROM_PTR=rht_from_ptr,
             WRITE_VALUES=values_dtype is not None, GUIDED=guide is not None,
             SIGNED_ZERO=signed_zero and values_dtype is None,
             **spec_constants(spec),
             **hadamard_constants(hadamard, signs_constant(hadamard_seed))),
        num_warps=tile.warps,
    )  # fmt: skip
    if spec.outer_block and t_amax is not None:
        t_amax = per_block_amax(t_amax, spec, padded // block)
    return codes, scales, t_amax, values


@torch.compiler.disable
def dequantize_e2m1(
    codes: torch.Tensor,
    scales: torch.Tensor,
    t_amax: torch.Tensor | None,
    spec: QuantSpec,
    shape: torch.Size | tuple[int, ...],
    axis: int,
    dtype: torch.dtype,
    tile: Tile | None = None,
) -> torch.Tensor:
    """Values of shape `shape` from packed codes and scale codes (axis-last padded layout);
    t_amax: a two-level spec's tensor amax (0-d or 1-element), or an outer-block spec's
    amaxes, one per outer block or one per block (`per_outer_amax`)."""
    view = AxisView.of(shape, axis)
    block = int(spec.block)
    padded = codes.shape[-1] * 2
    if t_amax is not None and spec.outer_block:
        t_amax = per_outer_amax(t_amax, spec, padded)
    tile = tile or choose_tile(view, padded, block, None)
    grid, along = _grid(view, tile, padded)
    out = torch.empty(shape, dtype=dtype, device=codes.device)
    constants = _scale_constants(spec)
    mini = spec.scale_format.minifloat
    launch(
        dequantize_kernel, grid,
        (codes.contiguous(), scales.contiguous(), out, t_amax,
         view.outer, view.inner, view.length, padded, along),
        dict(ROWS=tile.rows, COLS=tile.cols, BLOCK=block, TRANSPOSED=view.transposed,
             POW2_SCALE=constants["POW2_SCALE"], SCALE_MBITS=constants["SCALE_MBITS"],
             SCALE_MIN_EXP=constants["SCALE_MIN_EXP"],
             SCALE_MAX_CODE=mini.max_code if mini is not None else 254,
             **prescale_constants(spec), TENSOR_SCALE=t_amax is not None,
             **two_level_constants(spec), E1M2=spec.element == "e1m2",
             OUTER=outer_constants(spec)["OUTER"]),
        num_warps=tile.warps,
    )  # fmt: skip
    return out
