"""The last step of a two-level tensor amax: the amax pass's partial maxima reduced and the
tensor's encode table written (`tiles.two_level`: every scale code's encode multiplier, and the
block factors), which the quantize kernels read instead of dividing in every block. A pair's
amax pass does it in its own launch, in the program that finishes last
(`last_program_tables`); other passes take one small launch per tensor amax
(`encode_table_kernel`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4cli.kernels.tiles.tile_ops import unsigned_minifloat_value
from fp4cli.kernels.tiles.two_level import (
    BLOCK_ENCODE_SLOT,
    ENCODE_TABLE,
    FOUR_ENCODE_SLOT,
    SCALE_CODES,
    block_encode,
    encode_multiplier,
    global_scales,
)


@triton.jit
def write_table(
    tensor_amax, table, SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX_CODE: tl.constexpr, TWO_LEVEL_TARGET: tl.constexpr, ELEM_INV: tl.constexpr,
):  # fmt: skip
    """The table of a tensor of finite amax A (a scalar) at `table`: G = min(S * E / A,
    FLT_MAX), D = 1 / G; entry c is min(1 / (s_c * D), FLT_MAX) for the scale value s_c of code
    c, entry BLOCK_ENCODE_SLOT is G * fl(1 / E), entry FOUR_ENCODE_SLOT G * fl(1 / 4)."""
    global_encode, global_decode = global_scales(tensor_amax, TWO_LEVEL_TARGET)
    codes = tl.arange(0, SCALE_CODES)
    # codes past the format's largest are never looked up: they repeat the largest's entry
    largest = tl.minimum(codes, SCALE_MAX_CODE)
    scale = unsigned_minifloat_value(largest, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX_CODE)
    tl.store(table + codes, encode_multiplier(scale, global_decode))
    tl.store(table + BLOCK_ENCODE_SLOT, block_encode(global_encode, ELEM_INV, False))
    tl.store(table + FOUR_ENCODE_SLOT, block_encode(global_encode, ELEM_INV, True))


PARTIALS_READ = tl.constexpr(1024)  # partial maxima the table kernel reads at a time


@triton.jit
def reduced_partials(partials_ptr, count):
    """The largest of `count` float32 partial maxima (each finite and at least 0), read from
    the L2 cache (other programs of the same launch may have just written them)."""
    top = tl.zeros([PARTIALS_READ], tl.float32)
    for start in range(0, count, PARTIALS_READ):
        index = start + tl.arange(0, PARTIALS_READ)
        partial = tl.load(partials_ptr + index, mask=index < count, other=0.0, cache_modifier=".cg")
        top = tl.maximum(top, partial)
    return tl.max(top, axis=0)


@triton.jit
def last_program_tables(
    partials_ptr, TABLES: tl.constexpr, SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr,
    SCALE_MAX_CODE: tl.constexpr, TWO_LEVEL_TARGET: tl.constexpr, ELEM_INV: tl.constexpr,
):  # fmt: skip
    """An amax pass's tables from its own launch, for the directions in TABLES (bit 0 the row
    direction, bit 1 the column direction; 0: none). The pass's workspace
    (`launch_pair.amax_workspace`) holds, from partials_ptr: the 2 x programs partial maxima,
    the two amaxes, a counter zeroed by the allocation, the two tables. Each program counts
    itself once its partial maxima are stored; the one that counts last reduces every
    program's and writes those directions' amaxes and tables (`write_table`)."""
    if TABLES != 0:
        programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        amax_ptr = partials_ptr + 2 * programs
        tl.debug_barrier()  # every thread's stores of this program before its count
        arrived = tl.atomic_add((amax_ptr + 2).to(tl.pointer_type(tl.int32)), 1, sem="acq_rel")
        if arrived == programs - 1:
            for direction in tl.static_range(2):
                if (TABLES >> direction) & 1:
                    tensor_amax = reduced_partials(partials_ptr + direction * programs, programs)
                    tl.store(amax_ptr + direction, tensor_amax)
                    write_table(
                        tensor_amax, amax_ptr + 3 + direction * ENCODE_TABLE, SCALE_MBITS,
                        SCALE_MIN_EXP, SCALE_MAX_CODE, TWO_LEVEL_TARGET, ELEM_INV,
                    )  # fmt: skip


@triton.jit
def encode_table_kernel(
    amax_ptr, table_ptr, partials_ptr, partial_count, REDUCE: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_MIN_EXP: tl.constexpr, SCALE_MAX_CODE: tl.constexpr,
    TWO_LEVEL_TARGET: tl.constexpr, ELEM_INV: tl.constexpr,
):  # fmt: skip
    """Program t: the table of the tensor whose amax is amax_ptr[t], into row t of table_ptr;
    REDUCE: that amax is first reduced from row t of the (tensors, partial_count) partial
    maxima of an amax pass (`amax.store_partial`) and written to amax_ptr[t]."""
    tensor = tl.program_id(0)
    if REDUCE:
        tensor_amax = reduced_partials(partials_ptr + tensor * partial_count, partial_count)
        tl.store(amax_ptr + tensor, tensor_amax)
    else:
        tensor_amax = tl.load(amax_ptr + tensor)
    write_table(
        tensor_amax, table_ptr + tensor * ENCODE_TABLE, SCALE_MBITS, SCALE_MIN_EXP,
        SCALE_MAX_CODE, TWO_LEVEL_TARGET, ELEM_INV,
    )  # fmt: skip
