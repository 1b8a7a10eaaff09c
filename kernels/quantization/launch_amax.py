"""The tensor amax pass of `quantize_pair`'s two-level directions: one read of the tensor for
both directions' amaxes (each after its own Hadamard transform), on the pair's tiles
(`amax.amax_pair_kernel`) or, for the commonest transformed pairs, on slabs whose butterflies
move nothing between threads (`amax_slabs`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.host.seeds import _seed_args, hadamard_constants, signs_constant
from fp4cli.kernels.quantization.launch import PAIR_TILE_COLS, PAIR_TILE_ROWS, reduced_partials
from fp4cli.kernels.tensor_scale.amax import amax_pair_kernel
from fp4cli.kernels.tensor_scale.amax_slabs import amax_both_kernel, amax_rht16_cols_kernel
from fp4cli.quant.blocking import transformed_length

if TYPE_CHECKING:
    from fp4cli.kernels.quantization.launch_pair import Direction


@torch.compiler.disable
def pair_amax(
    x: torch.Tensor,
    row: Direction | None,
    col: Direction | None,
    tile: tuple[int, int],
    round_bf16: bool = False,
) -> torch.Tensor:
    """[row direction's, column direction's] largest finite |value| quantized (after each
    direction's Hadamard transform; 0 for a direction without a tensor scale), float32, from
    one read of x (rows, cols); round_bf16: of a float32 x rounded to bfloat16 as it is read
    (`quantize_pair`'s read_as)."""
    return reduced_partials(pair_amax_partials(x, row, col, tile, round_bf16))


Partials = Callable[[int, torch.device], torch.Tensor]
# the amax kernels' table constexprs (`encode_table.last_program_tables`) of a pass that
# writes no tables
NO_TABLES: dict[str, object] = dict(
    TABLES=0, SCALE_MBITS=0, SCALE_MIN_EXP=0, SCALE_MAX_CODE=0, TWO_LEVEL_TARGET=0.0, ELEM_INV=0.0
)


def pair_amax_partials(
    x: torch.Tensor,
    row: Direction | None,
    col: Direction | None,
    tile: tuple[int, int],
    round_bf16: bool = False,
    allocate: Partials | None = None,
    tables: Mapping[str, object] = NO_TABLES,
) -> torch.Tensor:
    """`pair_amax`'s partial maxima, (2, programs) float32: a row per direction. `allocate`
    (programs, device) gives the pass the contiguous float32 tensor of 2 x programs elements
    to write them into (by default a new (2, programs) one). `tables`: the kernels' table
    constexprs, where the pass writes the tables too (into the workspace that `allocate`
    gave, `encode_table.last_program_tables`)."""
    allocate = allocate or _partials
    row_on = row is not None and row.spec.tensor_scale
    row_rht = row is not None and row_on and bool(row.hadamard)
    if col is not None and col.spec.tensor_scale and col.hadamard == 16 and not row_rht:
        return _amax_rht16_cols(x, col, row_on, round_bf16, allocate, tables)
    if row_rht and row.hadamard in BOTH_SLAB_LINES and col is not None and col.spec.tensor_scale \
            and col.hadamard == row.hadamard:  # fmt: skip
        return _amax_both(x, row, col, round_bf16, allocate, tables)
    rows, cols = x.shape
    col_rht = col is not None and col.spec.tensor_scale and bool(col.hadamard)
    col_on = col is not None and col.spec.tensor_scale
    br, bc, warps = _amax_tile(tile, row if row_on else None, col if col_on else None,
                               row_rht and col_rht)  # fmt: skip
    row_length = transformed_length(cols, row.hadamard if row is not None else None)
    col_length = transformed_length(rows, col.hadamard if col is not None else None)
    tiles_c = -(-max(cols, row_length) // bc)
    programs = -(-max(rows, col_length) // br) * tiles_c
    constants: dict[str, object] = {}
    seeds: list[object] = []
    for d, prefix in ((row, "ROW"), (col, "COL")):
        rht_ptr, rht_value, rht_from_ptr = _seed_args(d.hadamard_seed if d else 0, x.device)
        seeds += [rht_ptr, rht_value]
        hadamard = hadamard_constants(
            d.hadamard if d else None, signs_constant(d.hadamard_seed if d else 0)
        )
        constants |= {f"{prefix}_{k}": v for k, v in hadamard.items()}
        constants[f"{prefix}_ON"] = d is not None and d.spec.tensor_scale
        constants[f"{prefix}_RHT_SEED_FROM_PTR"] = rht_from_ptr
    partials = allocate(programs, x.device)
    launch(
        amax_pair_kernel, (programs,), (x, partials, *seeds, rows, cols, tiles_c),
        dict(BR=br, BC=bc, ROUND_BF16=round_bf16, **constants, **tables), num_warps=warps,
    )  # fmt: skip
    return partials


def _partials(programs: int, device: torch.device) -> torch.Tensor:
    """The two directions' partial maxima of an amax pass of `programs` programs."""
    return torch.empty((2, programs), dtype=torch.float32, device=device)


# A lone direction transformed over LONE_HADAMARD positions or more (MS-EDEN's RHT-128, on the
# pair's thin tiles): along the rows 8 x 256 at 2 warps, down the columns 128 x 32 at 4. On one
# H200, 8192 x 3072 bf16 after RHT-128: rows 35 us against 59 on the thin tile's 16 x 128 at 4
# warps (the fastest of 4 to 32 lines by 128 or 256 at 1 to 4 warps), columns 50 against 54 us
# (docs/benchmarks.md).
LONE_HADAMARD = 128
LONE_ROW_AMAX_TILE, LONE_COL_AMAX_COLS = (8, 256, 2), 32


def _amax_tile(
    tile: tuple[int, int], row: Direction | None, col: Direction | None, both_transformed: bool
) -> tuple[int, int, int]:
    """(BR, BC, warps) of the amax pass over a pair's tiles: the pair's tile, 4 warps (8 past
    4096 values); a pair transformed both ways in the smallest tile reads it 4 times wider
    with 2 warps (ue5m3-hadamard-sr's pairs, RHT-32 both ways: 71-72 us against 97 at
    8192 x 3072, 23 against 28 at 8192 x 768 on an H100, the fastest of 32..128 rows x
    64..256 columns at 2, 4 and 8 warps; the amax is the same); a lone direction (`row`,
    `col`: the directions whose amax is taken) transformed over LONE_HADAMARD positions or
    more the LONE_* tiles."""
    br, bc = tile
    if both_transformed and tile == (PAIR_TILE_ROWS, PAIR_TILE_COLS):
        return br, 4 * bc, 2
    lone = row if col is None else col if row is None else None
    if lone is not None and (lone.hadamard or 0) >= LONE_HADAMARD:
        if lone is row:
            lines, length, warps = LONE_ROW_AMAX_TILE
            return lines, max(length, lone.hadamard), warps
        return max(br, lone.hadamard), LONE_COL_AMAX_COLS, 4
    return br, bc, 4 if br * bc <= 4096 else 8


AMAX_SLAB_LINES, AMAX_SLAB_COLS = 4, 128  # a tile of the RHT-16 amax: 64 rows x 128
AMAX_PROGRAMS_PER_SM = 4  # measured best of 4, 8, 16 and one program per tile


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """The GPU's streaming multiprocessors; 1 for the interpreter's CPU tensors."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _striding_grid(
    x: torch.Tensor, tile_rows: int, tile_cols: int, per_multiprocessor: int
) -> tuple[int, int, int, bool]:
    """(programs, tiles, tiles along the columns, whether the tiles cover x exactly: loads
    without masks) of a slab amax pass over x (rows, cols) in tiles of tile_rows x tile_cols:
    at most per_multiprocessor programs an SM, each striding over the tiles."""
    rows, cols = x.shape
    tiles_c = -(-cols // tile_cols)
    tiles = -(-rows // tile_rows) * tiles_c
    programs = min(tiles, per_multiprocessor * multiprocessors(x.device))
    return programs, tiles, tiles_c, rows % tile_rows == 0 and cols % tile_cols == 0


def _amax_rht16_cols(
    x: torch.Tensor,
    col: Direction,
    plain: bool,
    round_bf16: bool,
    allocate: Partials,
    tables: Mapping[str, object],
) -> torch.Tensor:
    """Partial maxima: direction 1 the column direction's after its 16-point transform; with
    `plain`, direction 0 x's own (a row direction without a transform)."""
    rows, cols = x.shape
    programs, tiles, tiles_c, even = _striding_grid(
        x, 16 * AMAX_SLAB_LINES, AMAX_SLAB_COLS, AMAX_PROGRAMS_PER_SM
    )
    rht_ptr, rht_value, rht_from_ptr = _seed_args(col.hadamard_seed, x.device)
    partials = allocate(programs, x.device)
    launch(
        amax_rht16_cols_kernel, (programs,),
        (x, partials, rht_ptr, rht_value, rows, cols, tiles, tiles_c),
        dict(G=AMAX_SLAB_LINES, BC=AMAX_SLAB_COLS, PLAIN=plain, RHT_SEED_FROM_PTR=rht_from_ptr,
             NORM=hadamard_constants(16)["HADAMARD_NORM"],
             SIGNS=signs_constant(col.hadamard_seed), ROUND_BF16=round_bf16, EVEN=even,
             **tables),
        num_warps=4,
    )  # fmt: skip
    return partials


# The both-ways slab pass: tiles of 32 rows x 256 columns (slab lines by transform size: one
# of 32 rows, two of 16), 4 warps, 8 striding programs an SM (for 32 points, on an H100 the
# fastest or within 5% of 32 or 64 rows x 128 to 512 columns at 2, 4 and 8 warps, 4 or 8
# programs an SM or one a tile, at 8192 x 768 to 8192 x 8192; 16 points takes the same).
BOTH_SLAB_LINES = {32: 1, 16: 2}
BOTH_COLS, BOTH_WARPS, BOTH_PROGRAMS_PER_SM = 256, 4, 8


def _amax_both(
    x: torch.Tensor,
    row: Direction,
    col: Direction,
    round_bf16: bool,
    allocate: Partials,
    tables: Mapping[str, object],
) -> torch.Tensor:
    """Partial maxima of the row and column directions after their 16- or 32-point transforms
    (the same size both ways), from the slab kernel of that size."""
    rows, cols = x.shape
    size = row.hadamard
    lines = BOTH_SLAB_LINES[size]
    programs, tiles, tiles_c, even = _striding_grid(
        x, size * lines, BOTH_COLS, BOTH_PROGRAMS_PER_SM
    )
    row_ptr, row_value, row_from_ptr = _seed_args(row.hadamard_seed, x.device)
    col_ptr, col_value, col_from_ptr = _seed_args(col.hadamard_seed, x.device)
    partials = allocate(programs, x.device)
    launch(
        amax_both_kernel, (programs,),
        (x, partials, row_ptr, row_value, col_ptr, col_value, rows, cols, tiles, tiles_c),
        dict(SIZE=size, G=lines, BC=BOTH_COLS, NORM=hadamard_constants(size)["HADAMARD_NORM"],
             ROW_SEED_FROM_PTR=row_from_ptr, COL_SEED_FROM_PTR=col_from_ptr,
             ROW_SIGNS=signs_constant(row.hadamard_seed),
             COL_SIGNS=signs_constant(col.hadamard_seed), ROUND_BF16=round_bf16, EVEN=even,
             **tables),
        num_warps=BOTH_WARPS,
    )  # fmt: skip
    return partials
