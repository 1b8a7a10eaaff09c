"""The last step of a two-level tensor amax: one small launch per tensor amax
(`encode_table_kernel`) reduces the amax pass's partial maxima and writes the tensor's encode
table (`tiles.two_level`: every scale code's encode multiplier, and the block factors), which
the quantize kernels read instead of dividing in every block.
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
    """The largest of `count` float32 partial maxima (each finite and at least 0)."""
    top = tl.zeros([PARTIALS_READ], tl.float32)
    for start in range(0, count, PARTIALS_READ):
        index = start + tl.arange(0, PARTIALS_READ)
        top = tl.maximum(top, tl.load(partials_ptr + index, mask=index < count, other=0.0))
    return tl.max(top, axis=0)


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
