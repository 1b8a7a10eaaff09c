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

import contextlib
import functools
import inspect
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp4cli.formats import float32
from fp4cli.kernels.amax import amax_kernel
from fp4cli.kernels.dequantize import dequantize_kernel
from fp4cli.kernels.four_over_six import (
    FOUR_OVER_SIX_ESTIMATE,
    FOUR_OVER_SIX_MAE,
    FOUR_OVER_SIX_OFF,
)
from fp4cli.kernels.prescale import prescale_constants
from fp4cli.kernels.quantize import quantize_kernel
from fp4cli.kernels.tile_io import GRID_Y
from fp4cli.kernels.two_level import ENCODE_TABLE, encode_table_kernel
from fp4cli.quant import two_level
from fp4cli.quant.backend import interpreter_on
from fp4cli.quant.blocking import round_up, transformed_length
from fp4cli.quant.random_bits import Seed
from fp4cli.quant.spec import QuantSpec
from fp4cli.replay.recorder import active_recorder
from fp4cli.techniques.hadamard import FixedSigns, normalization

SeedOffset = tuple[torch.Tensor, int]  # a seed tensor and an offset the kernel adds to it


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


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


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
        cols = max(least, min(64, _pow2_at_least(padded_length)))
        rows = max(4, min(64, _pow2_at_least(view.inner), 4096 // cols))
        return Tile(rows, cols, 4)
    cols = max(least, min(1024, _pow2_at_least(padded_length)))
    rows = max(1, min(_pow2_at_least(view.outer), 1024 * row_warps // cols))
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


_SHAPES_ONLY = threading.local()


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Within: `launch` launches nothing. The launchers still allocate their outputs, so a
    custom op's fake implementation (torch.compile's shapes and dtypes) runs the real launcher
    code on fake tensors, with one definition of every output's layout."""
    previous = getattr(_SHAPES_ONLY, "on", False)
    _SHAPES_ONLY.on = True
    try:
        yield
    finally:
        _SHAPES_ONLY.on = previous


def launches_skipped() -> bool:
    """Whether a `shapes_only` block is running: launchers that call a kernel themselves
    return after allocating their outputs."""
    return getattr(_SHAPES_ONLY, "on", False)


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: Sequence[object],
    constexprs: Mapping[str, object],
    num_warps: int,
    fp_fusion: bool = True,
    **launch_options: Any,
) -> None:
    """kernel[grid](*args, **constexprs, num_warps=num_warps), with every argument passed by
    position in the kernel's parameter order (`args` first, then the constexprs by name);
    `fp_fusion=False` compiles it without fused multiply-adds (each product rounded alone);
    `launch_options` are Triton's others (num_stages, maxnreg). Within a recording
    (`fp4cli.replay`) the launch is recorded with the kernel it ran.

    Triton binds keyword arguments on every launch: for the pair kernel's 53 constexprs that
    took as long as the rest of its dispatch (H100 host: 104-112 us a launch with keywords, 54
    by position). A stand-in for a kernel (a test's) carries the kernel's `fn`."""
    if launches_skipped():
        return
    rest = _parameter_names(kernel)[len(args) :]
    if len(rest) != len(constexprs):
        raise TypeError(f"{kernel}: constexprs {sorted(constexprs)} are not its {list(rest)}")
    options: dict[str, Any] = {"num_warps": num_warps, **launch_options}
    if not fp_fusion:
        options["enable_fp_fusion"] = False
    every = (*args, *[constexprs[name] for name in rest])
    recorder = active_recorder()
    if recorder is None:
        kernel[grid](*every, **options)
        return
    with recorder.paused():
        compiled = kernel[grid](*every, **options)
    recorder.record_launch(kernel, grid, every, options, None if interpreter_on() else compiled)


def partial_column_sums(
    column_sums: torch.Tensor | None, cols: int, tiles_r: int, device: torch.device
) -> torch.Tensor | None:
    """For `column_sums` (cols,) float32, checked here, the (cols, tiles_r) float32 buffer a
    kernel writes each row tile's column sums into (`tile_io.store_column_sums`; each column's
    partial sums contiguous); None without column sums."""
    if column_sums is None:
        return None
    if column_sums.shape != (cols,) or column_sums.dtype != torch.float32:
        raise ValueError(f"column_sums must be float32 of shape ({cols},)")
    return torch.empty((cols, tiles_r), dtype=torch.float32, device=device)


def add_column_sums(partial_sums: torch.Tensor | None, column_sums: torch.Tensor | None) -> None:
    """column_sums = the sum of the tiles' partial sums (summed in float32 over each tile's
    rows, then over the tiles)."""
    if partial_sums is not None:
        torch.sum(partial_sums, 1, out=column_sums)


@functools.cache
def _parameter_names(kernel: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(kernel.fn).parameters)


def _signed64(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def _seed_args(
    seed: Seed | SeedOffset | FixedSigns | None, device: torch.device
) -> tuple[torch.Tensor | None, int, bool]:
    """(pointer argument, value argument, whether the kernel reads the pointer). A
    (tensor, offset) pair is the seed tensor + offset, added in the kernel. Fixed Hadamard
    signs need no seed (they reach the kernel as a constexpr, `signs_constant`)."""
    if isinstance(seed, FixedSigns):
        return None, 0, False
    if isinstance(seed, tuple):
        tensor, offset = seed
        return _seed_pointer(tensor, device), _signed64(offset), True
    if isinstance(seed, torch.Tensor):
        return _seed_pointer(seed, device), 0, True
    return None, _signed64(int(seed or 0)), False


def _seed_pointer(seed: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A one-element int64 seed tensor on `device` (the kernels read its first element): the
    seed itself when it already is one, as a training step's is (no launch, no host time)."""
    if seed.dtype == torch.int64 and seed.device == device and seed.numel() == 1:
        return seed
    return seed.to(device=device, dtype=torch.int64).reshape(1)


def _scale_constants(spec: QuantSpec) -> dict[str, object]:
    """The scale format's constexprs (the quantize kernels' SCALE_*)."""
    fmt = spec.scale_format
    if fmt.kind == "pow2":
        return dict(POW2_SCALE=True, SCALE_MBITS=0, SCALE_MIN_EXP=0, SCALE_MAX=0.0, SCALE_NAN=255)
    mini = fmt.minifloat
    assert mini is not None
    return dict(
        POW2_SCALE=False,
        SCALE_MBITS=mini.mbits,
        SCALE_MIN_EXP=mini.min_exponent,
        SCALE_MAX=mini.max_value,
        SCALE_NAN=fmt.nan_code,
    )


def two_level_constants(spec: QuantSpec) -> dict[str, float]:
    """DECODE_INV, the quantize and dequantize kernels' two-level constant: 1 / (scale max *
    element max) as a float32 value (`fp4cli.quant.two_level.constants`). The encode side's
    constants live in the tensor's table (`encode_tables`)."""
    return dict(DECODE_INV=float32(two_level.constants(spec)[2]))


@functools.lru_cache(maxsize=64)
def outer_constants(spec: QuantSpec) -> dict[str, object]:
    """The quantize kernels' outer-block constexprs: OUTER, the blocks in one of
    `spec.outer_block`'s outer blocks (0 without), and the encode formulas' S * E and 1 / E
    (`two_level.outer_block_scales`) as float32 values."""
    if not spec.outer_block:
        return dict(OUTER=0, TWO_LEVEL_TARGET=0.0, ELEM_INV=0.0)
    target, element_inverse, _ = two_level.constants(spec)
    return dict(
        OUTER=spec.outer_block // int(spec.block),
        TWO_LEVEL_TARGET=float32(target),
        ELEM_INV=float32(element_inverse),
    )


def group_side(spec: QuantSpec) -> int:
    """The values along the axis a tile must hold whole: an outer block's, an MS-EDEN group's
    (0: neither)."""
    return max(spec.outer_block, spec.eden_group if spec.rounding == "eden" else 0)


def rounding_constants(spec: QuantSpec) -> dict[str, object]:
    """SR (stochastic rounding's bits a value, `sr_bits`: 24, 16 or 8; 0 without), AWAY and
    EDEN (MS-EDEN's group in blocks, 0 without; its elements round to nearest with ties away)
    of the quantize kernels."""
    eden = spec.rounding == "eden"
    return dict(
        SR=spec.sr_bits if spec.rounding == "sr" else 0,
        AWAY=spec.rounding == "away" or eden,
        EDEN=spec.eden_group // int(spec.block) if eden else 0,
    )


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


@functools.lru_cache(maxsize=64)
def _table_constants(spec: QuantSpec) -> dict[str, object]:
    """The constexprs of `two_level.encode_table_kernel` for `spec`'s two-level scaling: the
    scale format's, and S * E and 1 / E as float32 values."""
    mini = spec.scale_format.minifloat
    assert mini is not None, "two-level scaling needs a minifloat block scale"
    target, element_inverse, _ = two_level.constants(spec)
    return dict(
        SCALE_MBITS=mini.mbits,
        SCALE_MIN_EXP=mini.min_exponent,
        SCALE_MAX_CODE=mini.max_code,
        TWO_LEVEL_TARGET=float32(target),
        ELEM_INV=float32(element_inverse),
    )


def same_tables(a: QuantSpec, b: QuantSpec) -> bool:
    """Whether tensors under these two two-level specs get their encode tables from one
    formula (one launch makes both)."""
    return _table_constants(a) == _table_constants(b)


def encode_tables(
    amax: torch.Tensor, spec: QuantSpec, partials: torch.Tensor | None = None
) -> torch.Tensor:
    """(n, ENCODE_TABLE) float32: the encode table (`two_level.encode_table_kernel`) of each of
    the n tensor amaxes in `amax` (float32, n elements) under `spec`'s two-level scaling, from
    one launch. partials (n, programs): an amax pass's partial maxima (`amax.store_partial`),
    reduced in that launch into `amax` (then an output)."""
    amax = amax.reshape(-1)
    tables = torch.empty(
        (amax.numel(), ENCODE_TABLE.value), dtype=torch.float32, device=amax.device
    )
    reduce = partials is not None
    if partials is None:
        partials = amax
    elif partials.shape[0] != amax.numel() or not partials.is_contiguous():
        raise ValueError("partial maxima must be contiguous, a row per tensor amax")
    launch(
        encode_table_kernel, (amax.numel(),), (amax, tables, partials, partials.shape[-1]),
        dict(REDUCE=reduce, **_table_constants(spec)), 4,
    )  # fmt: skip
    return tables


def signs_constant(hadamard_seed: Seed | SeedOffset | FixedSigns | None) -> int:
    """A transform's HADAMARD_SIGNS (`tile_ops.negated_positions`): -1 for signs drawn from
    its seed, else the fixed signs' mask."""
    return hadamard_seed.flips if isinstance(hadamard_seed, FixedSigns) else -1


def _hadamard_constants(hadamard: int | None, signs: int = -1) -> dict[str, object]:
    """The transform's constexprs; `signs` as `signs_constant` gives them."""
    if not hadamard:
        return dict(HADAMARD=0, LOG2_HADAMARD=0, HADAMARD_NORM=1.0, HADAMARD_SIGNS=-1)
    return dict(
        HADAMARD=hadamard,
        LOG2_HADAMARD=hadamard.bit_length() - 1,
        HADAMARD_NORM=normalization(hadamard),
        HADAMARD_SIGNS=signs,
    )


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
             **_hadamard_constants(hadamard, signs_constant(hadamard_seed))),
        tile.warps,
    )  # fmt: skip
    return partials


def four_over_six_mode(spec: QuantSpec) -> int:
    """The single-direction kernel's FOUR_OVER_SIX: off, the float32 estimate first (squared
    errors) or the exact absolute errors."""
    if not spec.four_over_six:
        return FOUR_OVER_SIX_OFF.value
    absolute = spec.four_over_six_metric == "mae"
    return (FOUR_OVER_SIX_MAE if absolute else FOUR_OVER_SIX_ESTIMATE).value


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
        dict(ROWS=tile.rows, COLS=tile.cols, BLOCK=block, TRANSPOSED=view.transposed,
             CEIL=spec.scale_rule == "ceil", **rounding_constants(spec), GROUPED=grouped,
             SEED_FROM_PTR=seed_from_ptr, RHT_SEED_FROM_PTR=rht_from_ptr,
             **prescale_constants(spec), TENSOR_SCALE=spec.tensor_scale,
             **two_level_constants(spec),
             WRITE_VALUES=values_dtype is not None, GUIDED=guide is not None,
             E1M2=spec.element == "e1m2", FOUR_OVER_SIX=four_over_six_mode(spec),
             SIGNED_ZERO=signed_zero and values_dtype is None,
             **_scale_constants(spec), **outer_constants(spec),
             **_hadamard_constants(hadamard, signs_constant(hadamard_seed))),
        tile.warps,
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
        tile.warps,
    )  # fmt: skip
    return out
