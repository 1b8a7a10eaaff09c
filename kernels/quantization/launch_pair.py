"""Python side of `quantize_pair`: a 2-D tensor quantized along its rows' length and along its
columns in one launch (`quantize_pair.py`).

Each direction's outputs are exactly `quantize_e2m1`'s for that axis (axis 1 for the row
direction, axis 0 for the column direction): packed codes and scale codes in the axis-last
padded layout, or the dequantized values in the (transformed) input's layout.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.host.seeds import SeedOffset, _seed_args, hadamard_constants, signs_constant
from fp4cli.kernels.host.spec_constants import spec_constants, table_constants
from fp4cli.kernels.host.tiling import ColumnSums, add_column_sums, partial_column_sums
from fp4cli.kernels.quantization.launch import (
    PAIR_TILE_COLS,
    PAIR_TILE_ROWS,
    dequantize_e2m1,
    group_side,
    outer_count,
    same_tables,
    sr_group,
    write_tables,
)
from fp4cli.kernels.quantization.launch_amax import NO_TABLES, pair_amax_partials
from fp4cli.kernels.quantization.quantize_pair import quantize_pair_kernel
from fp4cli.kernels.tiles.two_level import ENCODE_TABLE
from fp4cli.quant.blocking import round_up, transformed_length
from fp4cli.quant.random_bits import Seed
from fp4cli.quant.spec import QuantSpec
from fp4cli.techniques.hadamard import FixedSigns
from fp4cli.techniques.qema import AverageGuide

PAIR_MAX_ELEMENTS = 16384  # a pair needing a larger tile takes two launches


@dataclass(frozen=True)
class Direction:
    """One direction's quantizer: spec (e2m1; two-level and 2-D tiles too), SR seed, Hadamard
    size and seed (each an int, a tensor, or a (tensor, offset) pair; the Hadamard's may be
    `FixedSigns`), and the dtype to write
    dequantized values in (None: packed codes and scale codes; not for 2-D tiles). With
    `block_values`, a two-level spec's values are q * s, without the tensor scale
    (`QuantizedTensor.block_values`)."""

    spec: QuantSpec
    seed: Seed | SeedOffset | None = None
    hadamard: int | None = None
    hadamard_seed: Seed | SeedOffset | FixedSigns = 0
    values_dtype: torch.dtype | None = None
    block_values: bool = False

    def side(self) -> int:
        """The tile side along this direction's blocks: whole blocks, transforms and outer
        blocks."""
        return max(int(self.spec.block), self.hadamard or 0, group_side(self.spec))


@dataclass(frozen=True)
class Quantized:
    """One direction's result: (codes, scales) or values, and a two-level spec's tensor amax."""

    codes: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    values: torch.Tensor | None = None
    tensor_amax: torch.Tensor | None = None


def pair_tile(row: Direction | None, col: Direction | None) -> tuple[int, int] | None:
    """(BR, BC) of the one-launch tile for these directions, or None when it would not fit.
    Directions that are both wide (`_wide`) take two launches, and a lone wide direction a
    tile THIN_TILE_ELEMENTS in all (`_thin_tile`)."""
    if row is not None and col is not None and _wide(row) and _wide(col):
        return None
    lone = _lone(row, col)
    if lone is not None and _wide(lone):
        return _thin_tile(lone, lone is row)
    br = max(PAIR_TILE_ROWS, col.side() if col is not None else 0, _square(row))
    bc = max(PAIR_TILE_COLS, row.side() if row is not None else 0, _square(col))
    if br * bc > PAIR_MAX_ELEMENTS:
        if row is None or col is None:
            return None
        bc = max(PAIR_TILE_ROWS, row.side(), _square(col))
        if br * bc > PAIR_MAX_ELEMENTS:
            return None
    return br, bc


# Directions that span 128 positions or more both ways (outer blocks, RHT-128) need 128 x 128
# tiles in one launch; two launches of thin tiles are faster. On an H200, TetraJet-v2's dY pair
# (SR and RHT-16 both ways, outer blocks of 128, 8192 x 3072 bf16) took 0.46-1.40 ms in one
# launch at 4, 8 or 16 warps, 0.36-0.40 ms as two launches of thin tiles (0.48 ms with the lone
# directions' usual 32 x 128 and 128 x 64 tiles); X's pair 0.21 and 0.22 ms. Of 16 or 32 lines
# by 128 and 128 by 16 to 64 at 2 to 8 warps, 16 lines (at `pair_warps`' warps) was the fastest
# or within 6% of it, but for the rows rounded to nearest. Quartet II's dY pair (MS-EDEN after
# RHT-128 both ways, 8192 x 3072): 2.41 ms in one launch, 1.08 ms in two of 16 lines, 1.30 ms of
# the usual tiles (bf16 values; packed codes 0.81, 0.57 and 0.62 ms) (docs/benchmarks.md).
WIDE_SIDE = 128
THIN_TILE_ELEMENTS = 2048


def _lone(row: Direction | None, col: Direction | None) -> Direction | None:
    """The one direction given, or None where both or neither are."""
    return row if col is None else col if row is None else None


def _wide(d: Direction) -> bool:
    """Whether a direction takes thin tiles: outer blocks, or a side of WIDE_SIDE or more."""
    return bool(d.spec.outer_block) or d.side() >= WIDE_SIDE


def _thin_tile(d: Direction, along_rows: bool) -> tuple[int, int]:
    """A lone wide direction's tile: its side along the blocks, THIN_TILE_ELEMENTS in all."""
    side = d.side()
    across = max(1, THIN_TILE_ELEMENTS // side)
    return (across, side) if along_rows else (side, across)


# On one H200, MS-EDEN after RHT-128 alone at 8192 x 3072 bf16 (Quartet II's dY): down the
# columns 0.34 ms (values) and 0.22 ms (codes) at 2 warps against 0.38 and 0.34 at 4, 0.61-0.66
# at 8; along the rows (butterflies as sums) values 0.23 ms at 4 warps, 0.21 at 8, 0.31 at 2,
# codes 0.17 ms at 4, 0.18-0.20 at 8 or 2; TetraJet-v2's outer blocks along the rows 0.08 ms at 2
# or 4, 0.09 at 8. The step: quartet2 3.36x -> 2.62x bf16, tetrajet-v2 1.92x -> 1.59x with the
# sums (docs/benchmarks.md).
# On the smallest tile, 2 warps but where both directions draw 24 random bits a value. On an
# H200 (`benchmarks/pair_warps_probe.py`, a 768 -> 3072 layer at 8,192 tokens, us at 2 / 4
# warps): nvfp4's dY pair (8-bit SR both ways, RHT-16 down the columns) 113.5 / 130.1, its X
# pair 28.3 / 29.2; tetrajet's X pair (24-bit SR down the columns) 26.3 / 28.2, its dY pair
# (24-bit SR both ways) 139.9 / 132.6; with 8-bit SR, X 21.3 / 24.4 and dY 99.4 / 110.6.
def pair_warps(br: int, bc: int, row: Direction | None, col: Direction | None) -> int:
    """Warps for a [br, bc] tile: a lone wide direction's thin tile 4 along the rows and 2 down
    the columns; else 2 for the smallest tile, 4 there where both directions draw 24 random
    bits a value; larger tiles 4, or 8 beyond 4096 values."""
    lone = _lone(row, col)
    if lone is not None and _wide(lone):
        return 4 if lone is row else 2  # along the rows, down the columns
    if br * bc <= PAIR_TILE_ROWS * PAIR_TILE_COLS:
        return 4 if _draws_24_bits(row) and _draws_24_bits(col) else 2
    return 4 if br * bc <= 4096 else 8


def _draws_24_bits(d: Direction | None) -> bool:
    return d is not None and d.spec.rounding == "sr" and d.spec.sr_bits == 24


def _square(d: Direction | None) -> int:
    """The tile side across a direction's blocks that its 2-D squares need."""
    return int(d.spec.block) if d is not None and d.spec.tile2d else 0


def _direction_args(
    d: Direction | None,
    length: int,
    lines: int,
    amax: torch.Tensor | None,
    table: torch.Tensor | None,
    device: torch.device,
    prefix: str,
) -> tuple[list[object], dict[str, object], Quantized | None, int, int]:
    """(pointer/seed arguments, constexprs, outputs, out_length, padded_length) of a direction
    quantizing `lines` lines of `length` positions; `amax` and `table`: its tensor amax and
    encode table (two-level). The constexprs are shared between calls: not to be changed."""
    if d is None:
        args: list[object] = [None, None, None, None, 0, None, 0, None, None]
        return args, _direction_constants(None, None, False, False, False, prefix), None, 1, 1
    block = int(d.spec.block)
    out_length = transformed_length(length, d.hadamard)
    padded = round_up(out_length, block)
    if d.values_dtype is not None:
        shape = (out_length, lines) if prefix == "COL" else (lines, out_length)
        values = torch.empty(shape, dtype=d.values_dtype, device=device)
        out = Quantized(values=values, tensor_amax=amax)
    else:
        codes = torch.empty((lines, padded // 2), dtype=torch.uint8, device=device)
        scales = torch.empty((lines, padded // block), dtype=torch.uint8, device=device)
        if d.spec.outer_block:  # one per outer block, written by the kernel
            outer = outer_count(padded, d.spec)
            amax = torch.empty((lines, outer), dtype=torch.float32, device=device)
        out = Quantized(codes, scales, tensor_amax=amax)
    seed_ptr, seed_value, seed_from_ptr = _seed_args(d.seed, device)
    rht_ptr, rht_value, rht_from_ptr = _seed_args(d.hadamard_seed, device)
    args = [out.codes, out.scales, out.values, seed_ptr, seed_value, rht_ptr, rht_value, amax,
            table]  # fmt: skip
    constants = _direction_constants(
        d.spec, d.hadamard, d.values_dtype is not None, seed_from_ptr, rht_from_ptr, prefix,
        d.block_values, signs_constant(d.hadamard_seed),
    )  # fmt: skip
    return args, constants, out, out_length, padded


@functools.lru_cache(maxsize=512)
def _direction_constants(
    spec: QuantSpec | None,
    hadamard: int | None,
    write_values: bool,
    seed_from_ptr: bool,
    rht_from_ptr: bool,
    prefix: str,
    block_values: bool = False,
    signs: int = -1,
) -> dict[str, object]:
    """A direction's constexprs, named PREFIX_NAME (computed once per combination: a launch's
    host time counts in every eager step)."""
    if spec is None:  # an idle direction: the default spec's constants, nothing on
        constants = dict(
            ON=False, SEED_FROM_PTR=False, RHT_SEED_FROM_PTR=False, WRITE_VALUES=False,
            TILE2D=False, VALUES_TENSOR_SCALE=False,
            **spec_constants(QuantSpec()), **hadamard_constants(None),
        )  # fmt: skip
    else:
        constants = dict(
            ON=True, SEED_FROM_PTR=seed_from_ptr, RHT_SEED_FROM_PTR=rht_from_ptr,
            WRITE_VALUES=write_values, TILE2D=spec.tile2d,
            VALUES_TENSOR_SCALE=spec.tensor_scale and not block_values,
            **spec_constants(spec), **hadamard_constants(hadamard, signs),
        )  # fmt: skip
    return {f"{prefix}_{k}": v for k, v in constants.items()}


def _check_directions(row: Direction | None, col: Direction | None, double: bool) -> None:
    for d in (row, col):
        if d is not None and d.spec.tile2d and (d.values_dtype is None or d.hadamard):
            raise ValueError("2-D tiles are quantized to values, without a Hadamard transform")
        if d is not None and d.block_values and d.values_dtype is None:
            raise ValueError("block values are values: give the direction a values_dtype")
    if double and row is not None and row.block_values:
        raise ValueError("double quantization re-quantizes the row direction's whole values")
    if double and col is not None and col.spec.whole_tensor_scale:
        raise ValueError("double quantization into a two-level spec needs the row values' amax")


@dataclass(frozen=True)
class PairScales:
    """A two-level pair's amax pass and encode tables, views of one float32 allocation split in
    one host step (`amax_workspace`; each allocation and each view is a step of a replayed
    program): the pass's partial maxima (a row of `programs` per direction, one after the
    other), the directions' tensor amaxes, a counter of the pass's finished programs (zeroed
    by the allocation, read as int32 by the kernel), then their encode tables. Each column
    direction's amax and table lie right after the row direction's, so one launch writes both
    (`encode_table.last_program_tables`)."""

    partials: torch.Tensor
    programs: int
    row_amax: torch.Tensor
    col_amax: torch.Tensor
    counter: torch.Tensor
    row_table: torch.Tensor
    col_table: torch.Tensor


def amax_workspace(programs: int, device: torch.device) -> PairScales:
    """The `PairScales` of an amax pass of `programs` programs, zeroed."""
    size = ENCODE_TABLE.value
    workspace = torch.zeros(2 * programs + 3 + 2 * size, dtype=torch.float32, device=device)
    views = workspace.split_with_sizes([2 * programs, 1, 1, 1, size, size])  # one step
    return PairScales(views[0], programs, *views[1:])


def pair_tables(scales: PairScales, row: Direction | None, col: Direction | None) -> None:
    """The two-level directions' amaxes reduced from the pass's partial maxima, and their
    encode tables, by a launch a direction: for directions whose specs need tables of
    different formulas, which the pass's own launch does not write (`pass_tables`)."""
    for i, d in enumerate((row, col)):
        if d is not None and d.spec.tensor_scale:
            amax, table = (scales.row_amax, scales.row_table) if i == 0 else \
                (scales.col_amax, scales.col_table)  # fmt: skip
            partials = scales.partials[i * scales.programs :] if i else scales.partials
            write_tables(amax, table, d.spec, 1, partials, scales.programs)


def pass_tables(row: Direction | None, col: Direction | None) -> dict[str, object] | None:
    """The amax kernels' table constexprs where the pass itself can write the directions'
    tables (`encode_table.last_program_tables`): one direction with a table, or two whose
    specs share the formula; None where each needs a launch of its own."""
    scaled = [(bit, d.spec) for bit, d in ((1, row), (2, col))
              if d is not None and d.spec.tensor_scale]  # fmt: skip
    if len(scaled) == 2 and not same_tables(scaled[0][1], scaled[1][1]):
        return None
    return dict(TABLES=sum(bit for bit, _ in scaled), **table_constants(scaled[0][1]))


def pair_amax_pass(
    x: torch.Tensor,
    row: Direction | None,
    col: Direction | None,
    tile: tuple[int, int],
    round_bf16: bool = False,
) -> tuple[torch.Tensor | None, ...]:
    """(row amax, column amax, row table, column table) of the directions with one tensor scale
    for their whole tensor (None for the others): `quantize_pair`'s amax pass over x in its
    [tile] tiles, each direction's amax of x as it quantizes it (transformed), then their
    encode tables, written by the pass's launch where it can (`pass_tables`)."""
    row_pass, col_pass = (d if d is not None and d.spec.whole_tensor_scale else None
                          for d in (row, col))  # fmt: skip
    if row_pass is None and col_pass is None:
        return None, None, None, None
    made: list[PairScales] = []

    def allocate(programs: int, device: torch.device) -> torch.Tensor:
        made.append(amax_workspace(programs, device))
        return made[0].partials

    tables = pass_tables(row_pass, col_pass)
    pair_amax_partials(x, row_pass, col_pass, tile, round_bf16, allocate, tables or NO_TABLES)
    scales = made[0]
    if tables is None:
        pair_tables(scales, row_pass, col_pass)
    if row_pass is None:
        return None, scales.col_amax, None, scales.col_table
    if col_pass is None:
        return scales.row_amax, None, scales.row_table, None
    return scales.row_amax, scales.col_amax, scales.row_table, scales.col_table


@torch.compiler.disable
def quantize_pair(
    x: torch.Tensor,
    row: Direction | None,
    col: Direction | None,
    double: torch.dtype | None = None,
    tile: tuple[int, int] | None = None,
    guide: torch.Tensor | AverageGuide | None = None,
    column_sums: torch.Tensor | ColumnSums | None = None,
    read_as: torch.dtype | None = None,
    sum_row_values: torch.dtype | None = None,
) -> tuple[Quantized | None, Quantized | None]:
    """x (rows, cols) quantized along axis 1 (`row`) and along axis 0 (`col`), in one launch.

    double: the column direction quantizes the row direction's dequantized values rounded to
    this dtype (TetraJet's double quantization) instead of x. guide (x's shape): the row
    direction rounds toward it (Q-EMA); an AverageGuide is formed in the kernel from x as
    read. column_sums (cols,) float32: filled with the sums of x's columns (a linear layer's
    bias gradient, from dY's read), summed in float32 over each tile's rows, then over the
    tiles (a `ColumnSums` keeps the tiles' sums unadded, for the gradients launch); with
    `sum_row_values`, the sums of the row direction's values rounded to that dtype instead (its
    GEMM's operand: TetraJet's bias gradient from the quantized dY). read_as=torch.bfloat16: a
    float32 x is quantized as x.to(torch.bfloat16), rounded as the kernels read it, the tensor
    amax pass's too (no cast pass). The caller checks `pair_tile` first: a pair it refuses must
    be quantized one direction at a time."""
    if x.dim() != 2:
        raise ValueError(f"quantize_pair takes a 2-D tensor (got shape {tuple(x.shape)})")
    round_bf16 = _rounds_to_bf16(x, read_as)
    if double is not None and (row is None or row.hadamard):
        raise ValueError(
            "double quantization needs the row direction, without a Hadamard transform"
        )
    average, count, warmup = isinstance(guide, AverageGuide), None, 0
    if isinstance(guide, AverageGuide):  # the kernel reads the average and the update count
        guide, count, warmup = guide.average, guide.updates, guide.warmup
    if guide is not None and (row is None or guide.shape != x.shape):
        raise ValueError("a guide needs the row direction and the input's shape")
    _check_directions(row, col, double is not None)
    _check_row_value_sums(row, double, column_sums, sum_row_values)
    x = x.contiguous()
    decoded = _values_from_codes(row, col) if column_sums is None and double is None else None
    if decoded is not None:
        return _decoded_values(x, decoded, tile, read_as)
    guide = guide.contiguous() if guide is not None else None
    rows, cols = x.shape
    chosen = tile or pair_tile(row, col)
    if chosen is None:
        raise ValueError("these directions do not fit one tile; quantize them one at a time")
    br, bc = chosen
    row_amax, col_amax, row_table, col_table = pair_amax_pass(x, row, col, chosen, round_bf16)
    row_args, row_constants, row_out, row_length, row_padded = _direction_args(
        row, cols, rows, row_amax, row_table, x.device, "ROW"
    )
    col_args, col_constants, col_out, col_length, col_padded = _direction_args(
        col, rows, cols, col_amax, col_table, x.device, "COL"
    )
    tiles_r = -(-max(rows, col_length) // br)
    tiles_c = -(-max(cols, row_length) // bc)
    partial_sums = partial_column_sums(column_sums, cols, tiles_r, x.device)
    launch(
        quantize_pair_kernel, (tiles_r * tiles_c,),
        (x, guide, count, warmup, partial_sums, *row_args, *col_args,
         rows, cols, row_length, row_padded, col_length, col_padded, tiles_c),
        dict(BR=br, BC=bc, DOUBLE=double is not None,
             SOURCE_BF16=(double or sum_row_values) == torch.bfloat16,
             SOURCE_F16=(double or sum_row_values) == torch.float16,
             ROUND_BF16=round_bf16, ROW_GUIDED=guide is not None, GUIDE_AVERAGE=average,
             COLUMN_SUMS=column_sums is not None, SUM_ROW_VALUES=sum_row_values is not None,
             **row_constants, **col_constants,
             # one Philox call per group of elements along the tile's rows (`sr_group`)
             ROW_GROUPED=_grouped(row, row_length, bc), COL_GROUPED=_grouped(col, cols, bc)),
        num_warps=pair_warps(br, bc, row, col),
    )  # fmt: skip
    add_column_sums(partial_sums, column_sums)
    return row_out, col_out


def _grouped(d: Direction | None, row_length: int, tile_cols: int) -> bool:
    """Whether a direction's random bits take one Philox call per group of elements along
    the rows of its tiles of `tile_cols` (rows `row_length` long in the input it indexes)."""
    if d is None:
        return False
    group = sr_group(d.spec)
    return row_length % group == 0 and tile_cols % group == 0


def _values_from_codes(row: Direction | None, col: Direction | None) -> Direction | None:
    """The column direction when it is a lone MS-EDEN direction whose values come from its
    packed codes, decoded by a second launch (else None): faster than writing them from the
    quantize launch (one H200, after RHT-128, bf16, the amax pass included: 0.274 against 0.328
    ms at 8192 x 3072, 0.077 against 0.088 at 8192 x 768). Along the rows the two took as long
    at 8192 x 3072 and the decode was slower at 8192 x 768, so the rows write their values
    (docs/benchmarks.md). The same bits: the values are the codes'."""
    if row is None and col is not None and col.spec.rounding == "eden" \
            and col.values_dtype is not None and not col.block_values:  # fmt: skip
        return col
    return None


def _decoded_values(
    x: torch.Tensor, col: Direction, tile: tuple[int, int] | None, read_as: torch.dtype | None
) -> tuple[None, Quantized]:
    """`quantize_pair`'s result for a lone column direction: its packed codes decoded to values
    in the (transformed) input's layout."""
    out = quantize_pair(x, None, replace(col, values_dtype=None), tile=tile, read_as=read_as)[1]
    assert out is not None
    shape = (transformed_length(x.shape[0], col.hadamard), x.shape[1])
    dtype = col.values_dtype
    assert dtype is not None
    values = dequantize_e2m1(out.codes, out.scales, out.tensor_amax, col.spec, shape, 0, dtype)
    return None, Quantized(values=values, tensor_amax=out.tensor_amax)


def _check_row_value_sums(
    row: Direction | None,
    double: torch.dtype | None,
    column_sums: torch.Tensor | ColumnSums | None,
    sum_row_values: torch.dtype | None,
) -> None:
    if sum_row_values is None:
        return
    if column_sums is None or row is None or row.hadamard or row.block_values:
        raise ValueError(
            "sum_row_values sums the row direction's whole values into column_sums: give "
            "both, and a row direction without a Hadamard transform or block values"
        )
    if double is not None and double != sum_row_values:
        raise ValueError("double quantization and the row value sums round to one dtype")


def rounds_as_read(source: torch.dtype, read_as: torch.dtype) -> bool:
    """Whether `quantize_pair` reads a `source` tensor as its cast to `read_as`, rounding in
    the kernels (the quantize launch, a tensor amax pass, an outer block's amax from the
    rounded tile): float32 as bfloat16."""
    return source == torch.float32 and read_as == torch.bfloat16


def _rounds_to_bf16(x: torch.Tensor, read_as: torch.dtype | None) -> bool:
    """Whether the pair kernel rounds x to bfloat16 as it reads it (`quantize_pair`'s
    read_as); a ValueError where it cannot."""
    if read_as is None or read_as == x.dtype:
        return False
    if not rounds_as_read(x.dtype, read_as):
        raise ValueError(f"read_as rounds float32 to bfloat16 (got {x.dtype} as {read_as})")
    return True
