"""The kernels' building blocks (fp4cli.kernels.tiles.tile_ops) on dense sweeps of float32 values,
against the reference rounding of fp4cli.formats, bit for bit: every grid point and midpoint of
a format, their float32 neighbours, subnormal inputs, values past the largest grid point; and
the Hadamard butterflies, both ways, against the reference transform."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fp4cli.formats import ELEMENT_FORMATS, encode, round_to_grid
from fp4cli.kernels.tiles import tile_ops
from fp4cli.kernels.tiles.tile_io import rounded_to_bf16
from fp4cli.kernels.tiles.tile_ops import (
    e2m1_code_rne,
    e2m1_code_sr,
    e2m1_rne_grid,
    e2m1_sr_grid,
    hadamard_rows,
    round_unsigned_minifloat,
    unsigned_minifloat_value,
)
from fp4cli.quant import QuantSpec
from fp4cli.quant.backend import interpreter_on
from fp4cli.quant.random_bits import uniform_from_bits
from fp4cli.techniques.hadamard import normalization, rht
from tests.kernel_cases import assert_bits, on_device

FORMATS = {
    "ue4m3": QuantSpec(scale="ue4m3").scale_format.minifloat,
    "ue5m3": QuantSpec(scale="ue5m3").scale_format.minifloat,
    "e2m1": QuantSpec().element_format,
}


@triton.jit
def _round_kernel(
    x_ptr, value_ptr, code_ptr, n, MBITS: tl.constexpr, MIN_EXP: tl.constexpr,
    MAX_VALUE: tl.constexpr, UP: tl.constexpr, ZERO_OK: tl.constexpr, SIZE: tl.constexpr,
):  # fmt: skip
    offsets = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    mask = offsets < n
    raw = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    value, code = round_unsigned_minifloat(raw, MBITS, MIN_EXP, MAX_VALUE, UP, ZERO_OK)
    tl.store(value_ptr + offsets, value, mask=mask)
    tl.store(code_ptr + offsets, code, mask=mask)


def sweep(fmt) -> torch.Tensor:
    """Every grid point and midpoint of fmt's magnitudes, each with its float32 neighbours,
    and a log-uniform spread from below the smallest subnormal to past the largest value."""
    grid = torch.tensor(
        sorted({fmt.decode_magnitude(code) for code in range(fmt.max_code + 1)}),
        dtype=torch.float32,
    )
    points = torch.cat([grid, (grid[1:] + grid[:-1]) / 2, grid * 1.25, grid[-1:] * 2])
    neighbours = [torch.nextafter(points, points + 1), torch.nextafter(points, points - 1)]
    spread = torch.exp2(torch.linspace(-150, 20, 4001))
    tiny = torch.tensor([0.0, 1e-45, 1e-40, 2.0**-126, 3.0e38, torch.finfo(torch.float32).max])
    values = torch.cat([points, *neighbours, spread, tiny]).abs()
    return torch.unique(values)


ROUNDED = {**FORMATS, "e4m3": ELEMENT_FORMATS["e4m3"], "e5m2": ELEMENT_FORMATS["e5m2"]}


@pytest.mark.parametrize("rule", ["rne", "up"])
@pytest.mark.parametrize("zero_ok", [True, False])
@pytest.mark.parametrize("name", ROUNDED)
def test_round_unsigned_minifloat_is_the_reference_rounding(name, rule, zero_ok):
    fmt = ROUNDED[name]
    raw = sweep(fmt)
    expected = round_to_grid(raw, fmt, rule)
    if not zero_ok:
        expected = torch.clamp(expected, min=fmt.min_positive)
    values, codes = torch.empty_like(raw), torch.empty(raw.shape, dtype=torch.int32)
    raw_d, values_d, codes_d = on_device(raw), on_device(values), on_device(codes)
    size = 1024
    _round_kernel[(triton.cdiv(raw.numel(), size),)](
        raw_d, values_d, codes_d, raw.numel(), MBITS=fmt.mbits, MIN_EXP=fmt.min_exponent,
        MAX_VALUE=fmt.max_value, UP=rule == "up", ZERO_OK=zero_ok, SIZE=size,
    )  # fmt: skip
    assert_bits(values_d.cpu(), expected, f"{name} {rule} values")
    assert_bits(codes_d.cpu(), encode(expected, fmt).to(torch.int32), f"{name} {rule} codes")


@triton.jit
def _value_kernel(
    code_ptr, value_ptr, n, MBITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_CODE: tl.constexpr,
    SIZE: tl.constexpr,
):  # fmt: skip
    offsets = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    mask = offsets < n
    code = tl.load(code_ptr + offsets, mask=mask, other=0)
    value = unsigned_minifloat_value(code, MBITS, MIN_EXP, MAX_CODE)
    tl.store(value_ptr + offsets, value, mask=mask)


MINIFLOATS = {**FORMATS, **{name: f for name, f in ELEMENT_FORMATS.items() if f.ebits > 0}}


@pytest.mark.parametrize("name", MINIFLOATS)
def test_unsigned_minifloat_value_of_every_code(name):
    """Every magnitude code's float32 value (normal, subnormal, zero; NaN past the largest
    code), as the format's own decoding gives it."""
    fmt = MINIFLOATS[name]
    codes = torch.arange(256 if not fmt.signed else fmt.sign_bit, dtype=torch.int32)
    expected = torch.tensor(
        [fmt.decode_magnitude(c) if c <= fmt.max_code else float("nan") for c in codes.tolist()],
        dtype=torch.float32,
    )
    values = on_device(torch.empty(codes.shape, dtype=torch.float32))
    _value_kernel[(1,)](
        on_device(codes), values, codes.numel(), MBITS=fmt.mbits, MIN_EXP=fmt.min_exponent,
        MAX_CODE=fmt.max_code, SIZE=256,
    )  # fmt: skip
    assert_bits(values.cpu(), expected, name)


@triton.jit
def _hadamard_rows_kernel(
    x_ptr, out_ptr, seed, ROWS: tl.constexpr, COLS: tl.constexpr, SIZE: tl.constexpr,
    LOG2_SIZE: tl.constexpr, NORM: tl.constexpr, BY_SUMS: tl.constexpr,
):  # fmt: skip
    offsets = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    x = tl.load(x_ptr + offsets)
    transformed = hadamard_rows(x, seed.to(tl.int64), ROWS, COLS, SIZE, LOG2_SIZE, NORM, BY_SUMS)
    tl.store(out_ptr + offsets, transformed)


def butterfly_edge_rows(cols: int) -> torch.Tensor:
    """Rows that test each butterfly's float32 operations: signed zeros (alone and among
    values), subnormals, sums that overflow to Inf (and Inf - Inf), Inf and NaN."""
    generator = torch.Generator().manual_seed(7)
    values = torch.randn(cols, generator=generator) * 4
    zeros = torch.where(torch.arange(cols) % 3 == 0, -0.0, 0.0)
    mixed = torch.where(torch.arange(cols) % 4 == 1, -0.0, values)
    subnormal = torch.randn(cols, generator=generator) * 1e-40
    huge = torch.where(torch.arange(cols) % 2 == 0, 3.0e38, -3.0e38)
    special = values.clone()
    special[3], special[cols // 2 + 5] = float("inf"), float("nan")
    return torch.stack([values, zeros, mixed, subnormal, huge, special, -zeros, values * 1e30])


@pytest.mark.parametrize("by_sums", [False, True, "reduce"])
@pytest.mark.parametrize("size", [4, 16, 32])
def test_hadamard_rows_is_the_reference_transform(size, by_sums, monkeypatch):
    """Both ways to the butterflies (pairs split and joined, or sums over each pair) give the
    reference `rht`'s bits, the sign of zero included. "reduce": the sums as the compiled
    kernels take them, reductions over each pair, which the interpreter otherwise replaces with
    the additions they are (`tile_ops.SUMS_BY_REDUCE`)."""
    if by_sums == "reduce" and interpreter_on():
        monkeypatch.setattr(tile_ops, "SUMS_BY_REDUCE", tl.constexpr(True))
    x = butterfly_edge_rows(64)
    expected = rht(x, -1, size, 11)
    out = on_device(torch.empty_like(x))
    _hadamard_rows_kernel[(1,)](
        on_device(x), out, 11, ROWS=x.shape[0], COLS=x.shape[1], SIZE=size,
        LOG2_SIZE=size.bit_length() - 1, NORM=normalization(size), BY_SUMS=bool(by_sums),
    )  # fmt: skip
    assert_bits(out.cpu(), expected, f"RHT-{size}, by sums: {by_sums}")


@triton.jit
def _rne_kernel(x_ptr, code_ptr, value_ptr, n, SIZE: tl.constexpr):
    offsets = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    mask = offsets < n
    magnitude = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(code_ptr + offsets, e2m1_code_rne(magnitude), mask=mask)
    tl.store(value_ptr + offsets, e2m1_rne_grid(magnitude), mask=mask)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter: 2|v| past float32
def test_rounding_to_nearest_is_the_reference_rounding():
    """`e2m1_code_rne` and `e2m1_rne_grid` on the E2M1 sweep (ties, their neighbours,
    subnormal inputs, past 6 up to the largest float32) against the reference rounding, and
    Inf and NaN saturated to code 7 (6.0): the kernels make NaN blocks NaN by their scale."""
    magnitude = sweep(FORMATS["e2m1"])
    # around 2^105, where the rounding's magic number would leave float32's exponents
    wide = torch.tensor([2.0**104, 1.9 * 2.0**104, 2.0**105, 1.5 * 2.0**105, 2.0**106, 2.0**127])
    magnitude = torch.cat([magnitude, wide, torch.tensor([float("inf"), float("nan")])])
    finite = magnitude.isfinite()
    expected = torch.where(finite, round_to_grid(magnitude, FORMATS["e2m1"], "rne"), 6.0)
    x = on_device(magnitude)
    codes = torch.empty(x.shape, dtype=torch.int32, device=x.device)
    values = torch.empty_like(x)
    _rne_kernel[(triton.cdiv(x.numel(), 1024),)](x, codes, values, x.numel(), SIZE=1024)
    assert_bits(values.cpu(), expected, "rne grid values")
    assert_bits(codes.cpu(), encode(expected, FORMATS["e2m1"]).to(torch.int32), "rne codes")


@triton.jit
def _sr_kernel(x_ptr, bits_ptr, code_ptr, value_ptr, n, SIZE: tl.constexpr):
    offsets = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    mask = offsets < n
    magnitude = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    bits = tl.load(bits_ptr + offsets, mask=mask, other=0).to(tl.uint32, bitcast=True)
    tl.store(code_ptr + offsets, e2m1_code_sr(magnitude, bits), mask=mask)
    tl.store(value_ptr + offsets, e2m1_sr_grid(magnitude, bits), mask=mask)


def sr_cases() -> tuple[torch.Tensor, torch.Tensor]:
    """Magnitudes of the E2M1 sweep (subnormals, grid points, midpoints, their neighbours, past
    6) each with random bits at and around its threshold: the top 24 bits equal to
    floor and ceil of F = fraction * 2^24, one either side, 0 and 2^24 - 1, and random words."""
    magnitude = sweep(FORMATS["e2m1"]).double()
    magnitude = magnitude[magnitude.isfinite()]
    spacing = torch.where(magnitude < 1, 0.5, torch.exp2(torch.floor(torch.log2(magnitude)) - 1))
    fraction = magnitude / spacing - torch.floor(magnitude / spacing)
    threshold = fraction * 2.0**24
    floor, ceil = torch.floor(threshold), torch.ceil(threshold)
    tops = [floor, ceil, floor - 1, ceil + 1, 0 * threshold, 0 * threshold + 2**24 - 1]
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        tops.append(torch.randint(0, 2**24, threshold.shape, generator=generator).double())
    top = torch.cat(tops).clamp(0, 2**24 - 1).long()
    low_bits = torch.randint(0, 256, top.shape, generator=generator)
    words = (top << 8) | low_bits
    return magnitude.repeat(len(tops)).float(), (words - (words >= 2**31) * 2**32).to(torch.int32)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter: 2|v| past float32
def test_stochastic_rounding_is_the_reference_rounding():
    """`e2m1_code_sr` and `e2m1_sr_grid` round up exactly where the reference's uniform number
    (the word's top 24 bits times 2^-24) is below the fraction, on words at the threshold."""
    magnitude, words = sr_cases()
    expected = round_to_grid(
        magnitude, FORMATS["e2m1"], "sr", uniform_from_bits(words.long() & 0xFFFFFFFF)
    )
    x, bits = on_device(magnitude), on_device(words)
    codes = torch.empty_like(bits)
    values = torch.empty_like(x)
    _sr_kernel[(triton.cdiv(x.numel(), 1024),)](x, bits, codes, values, x.numel(), SIZE=1024)
    assert_bits(values.cpu(), expected, "sr grid values")
    assert_bits(encode(values.cpu(), FORMATS["e2m1"]).to(torch.int32) & 7, codes.cpu() & 7)


@triton.jit
def _bf16_kernel(x_ptr, out_ptr, n, SIZE: tl.constexpr):
    offsets = tl.program_id(0) * SIZE + tl.arange(0, SIZE)
    mask = offsets < n
    tl.store(out_ptr + offsets, rounded_to_bf16(tl.load(x_ptr + offsets, mask=mask)), mask=mask)


def test_rounding_to_bfloat16_is_torchs_cast():
    """`rounded_to_bf16` against torch's float32 -> bfloat16 cast on random bit patterns (every
    exponent: subnormals, Inf, NaN payloads) and on each bfloat16 tie and its neighbours."""
    generator = torch.Generator().manual_seed(0)
    patterns = torch.randint(-(2**31), 2**31, (1 << 16,), dtype=torch.int64, generator=generator)
    random = patterns.to(torch.int32).view(torch.float32)
    halves = torch.randint(0, 1 << 16, (4096,), dtype=torch.int32, generator=generator)
    ties = ((halves << 16) | 0x8000).view(torch.float32)  # exactly halfway: to even
    x = torch.cat([random, ties, torch.nextafter(ties, ties * 2), torch.nextafter(ties, ties * 0)])
    out = torch.empty_like(x)
    x, out = on_device(x), on_device(out)
    _bf16_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), SIZE=1024)
    expected = x.to(torch.bfloat16).float()
    assert torch.equal(out.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert_bits(out[finite], expected[finite], "bfloat16 rounding")
