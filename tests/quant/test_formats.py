"""Element and scale formats: hand-derived code tables, packing, and FP8 against PyTorch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fp4cli.formats import (
    E2M1,
    E3M0,
    E4M3,
    E5M2,
    ELEMENT_FORMATS,
    INT4,
    SCALE_FORMATS,
    UE4M3,
    UE5M3,
    decode,
    encode,
    float32,
    minifloat,
    pack_nibbles,
    round_to_grid,
    unpack_nibbles,
)
from fp4cli.quant import QuantSpec, quantize
from tests import oracle_grids

NAN = float("nan")

# All 16 codes, by hand: code = sign<<3 | exponent<<1 | mantissa (E2M1), sign<<3 | exponent
# (E3M0, bias 3), sign<<3 | magnitude (INT4).
E2M1_VALUES = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
E3M0_VALUES = [0, 0.25, 0.5, 1, 2, 4, 8, 16, -0.0, -0.25, -0.5, -1, -2, -4, -8, -16]
INT4_VALUES = [0, 1, 2, 3, 4, 5, 6, 7, -0.0, -1, -2, -3, -4, -5, -6, -7]
FOUR_BIT = [(E2M1, E2M1_VALUES), (E3M0, E3M0_VALUES), (INT4, INT4_VALUES)]


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(("fmt", "values"), FOUR_BIT, ids=lambda v: getattr(v, "name", ""))
def test_decode_all_16_codes(fmt, values):
    got = decode(torch.arange(16, dtype=torch.uint8), fmt)
    assert got.dtype == torch.float32
    assert_same(got, torch.tensor(values, dtype=torch.float32))


def test_hand_picked_codes():
    code = torch.tensor([0b0111, 0b1001, 0b0001, 0b1111, 0b0100], dtype=torch.uint8)
    assert decode(code, E2M1).tolist() == [6.0, -0.5, 0.5, -6.0, 2.0]
    assert decode(code, E3M0).tolist() == [16.0, -0.25, 0.25, -16.0, 2.0]
    assert decode(code, INT4).tolist() == [7.0, -1.0, 1.0, -7.0, 4.0]


@pytest.mark.parametrize(("fmt", "values"), FOUR_BIT, ids=lambda v: getattr(v, "name", ""))
def test_encode_all_16_codes_round_trip(fmt, values):
    values_t = torch.tensor(values, dtype=torch.float32)
    codes = encode(values_t, fmt)
    assert codes.dtype == torch.uint8
    expected = torch.arange(16, dtype=torch.uint8)
    # -0.0 may be stored as +0 (code 0) or -0 (code 8): both decode to zero.
    assert codes[8].item() in (0, 8)
    keep = torch.arange(16) != 8
    assert torch.equal(codes[keep], expected[keep])
    assert_same(decode(codes, fmt), values_t)


@pytest.mark.parametrize("name", ["e2m1", "e3m0", "int4", "e4m3", "e5m2"])
def test_code_tables_match_oracle(name):
    fmt = ELEMENT_FORMATS[name]
    table = oracle_grids.code_table(name)
    codes = torch.tensor(sorted(table), dtype=torch.uint8)
    expected = torch.tensor([table[int(c)] for c in codes], dtype=torch.float32)
    assert_same(decode(codes, fmt), expected)
    # encode(decode(c)) == c for every finite code except negative zero
    nonzero = expected != 0
    assert torch.equal(encode(expected, fmt)[nonzero], codes[nonzero])
    assert fmt.max_value == oracle_grids.ELEMENT_MAX[name]


def test_pack_nibbles_low_first():
    codes = torch.tensor([[0x1, 0x2, 0x3, 0x4], [0xF, 0x0, 0x0, 0xA]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0xA0]]
    assert torch.equal(unpack_nibbles(packed), codes)


def test_pack_unpack_round_trip_random():
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 5, 64), generator=gen, dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (3, 5, 32)
    assert torch.equal(unpack_nibbles(packed), codes)
    # independent unpack: element 2i is the low nibble, 2i+1 the high nibble
    assert torch.equal(packed & 0xF, codes[..., 0::2])
    assert torch.equal(packed >> 4, codes[..., 1::2])
    everything = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_nibbles(unpack_nibbles(everything)), everything)


def test_pack_odd_length_raises():
    with pytest.raises(ValueError):
        pack_nibbles(torch.zeros(3, dtype=torch.uint8))


@pytest.mark.parametrize(
    ("fmt", "torch_dtype"),
    [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)],
    ids=["e4m3", "e5m2"],
)
def test_fp8_decode_all_256_codes_vs_torch(fmt, torch_dtype):
    codes = torch.arange(256, dtype=torch.uint8)
    expected = codes.view(torch_dtype).to(torch.float32)
    got = decode(codes, fmt)
    assert_same(got, expected)  # NaN codes included: both NaN
    finite = torch.isfinite(expected) & (expected != 0)
    assert torch.equal(encode(expected[finite], fmt), codes[finite])


def test_fp8_special_codes():
    assert torch.isnan(decode(torch.tensor([0x7F, 0xFF], dtype=torch.uint8), E4M3)).all()
    assert decode(torch.tensor([0x7E, 0xFE], dtype=torch.uint8), E4M3).tolist() == [448, -448]
    e5m2 = decode(torch.tensor([0x7B, 0x7C, 0xFC, 0x7D, 0x7E, 0x7F], dtype=torch.uint8), E5M2)
    assert e5m2[:3].tolist() == [57344.0, float("inf"), float("-inf")]
    assert torch.isnan(e5m2[3:]).all()
    assert E4M3.max_value == 448.0
    assert E5M2.max_value == 57344.0


def test_ue5m3_range():
    fmt = SCALE_FORMATS["ue5m3"]
    assert fmt.max_value == 61440.0
    assert fmt.min_value == 2.0**-17
    codes = torch.tensor([0, 1, 0b00001000, (30 << 3) | 7, 0b11111000], dtype=torch.uint8)
    got = decode(codes, UE5M3)
    assert got[:4].tolist() == [0.0, 2.0**-17, 2.0**-14, 61440.0]
    assert torch.isnan(got[4])  # exponent field 31 is reserved for NaN
    reserved = torch.arange(0b11111000, 256, dtype=torch.int64).to(torch.uint8)
    assert torch.isnan(decode(reserved, UE5M3)).all()
    every = torch.arange(0, 0b11111000, dtype=torch.int64).to(torch.uint8)
    assert_same(
        decode(every, UE5M3), torch.tensor(oracle_grids.SCALE_GRIDS["ue5m3"].values).float()
    )


def test_ue4m3_is_positive_e4m3():
    fmt = SCALE_FORMATS["ue4m3"]
    assert fmt.max_value == 448.0
    assert fmt.min_value == 2.0**-9
    codes = torch.arange(128, dtype=torch.uint8)
    assert_same(decode(codes, UE4M3), codes.view(torch.float8_e4m3fn).float())
    assert torch.isnan(decode(torch.tensor([0x7F], dtype=torch.uint8), UE4M3)).all()


def test_e8m0_scale_values():
    qt = quantize(torch.ones(2, 32), QuantSpec())
    all_codes = dataclasses.replace(qt, scales=torch.arange(256, dtype=torch.int64).to(torch.uint8))
    got = all_codes.scale_values()
    assert got.dtype == torch.float32
    expected = torch.tensor([2.0 ** (c - 127) for c in range(255)] + [NAN], dtype=torch.float64)
    assert_same(got, expected.to(torch.float32))
    assert got[0].item() == 2.0**-127  # a float32 subnormal, not flushed
    assert got[127].item() == 1.0
    assert got[254].item() == 2.0**127


def test_bf16_and_fp32_scale_format_ranges():
    assert SCALE_FORMATS["fp32"].max_value == float(torch.finfo(torch.float32).max)
    assert SCALE_FORMATS["bf16"].max_value == float(torch.finfo(torch.bfloat16).max)


def _sweep(name: str) -> torch.Tensor:
    """Grid points, midpoints, quarter points, values past max, tiny values; both signs."""
    grid = oracle_grids.GRIDS[name].array
    top = grid[-1]
    mids = (grid[:-1] + grid[1:]) / 2
    quarter = grid[:-1] + (grid[1:] - grid[:-1]) / 4
    three_q = grid[:-1] + 3 * (grid[1:] - grid[:-1]) / 4
    rng = np.random.default_rng(1)
    extra = [top * 1.01, top * 1.0625, top * 1.125, top * 2, 1e30, 1e-30, 1e-40, 2.0**-149]
    rand = rng.uniform(0, top * 1.2, 500)
    positive = np.concatenate([grid, mids, quarter, three_q, extra, rand]).astype(np.float32)
    return torch.from_numpy(np.concatenate([positive, -positive]))


@pytest.mark.parametrize("mode", ["rne", "away"])
@pytest.mark.parametrize("name", ["e2m1", "e3m0", "int4", "e4m3", "e5m2"])
def test_round_to_grid_vs_enumeration(name, mode):
    x = _sweep(name)
    expected = oracle_grids.round_to_grid(x.double().numpy(), oracle_grids.GRIDS[name], mode)
    got = round_to_grid(x, ELEMENT_FORMATS[name], mode)
    assert_same(got, torch.from_numpy(expected).float())


@pytest.mark.parametrize("name", ["e2m1", "e3m0", "int4", "e4m3", "e5m2"])
def test_round_to_grid_sr_brackets(name):
    x = _sweep(name)
    gen = torch.Generator().manual_seed(3)
    u = torch.rand(x.shape, generator=gen)
    got = round_to_grid(x, ELEMENT_FORMATS[name], "sr", uniform=u)
    expected = oracle_grids.round_to_grid(
        x.double().numpy(), oracle_grids.GRIDS[name], "sr", u.numpy()
    )
    assert_same(got, torch.from_numpy(expected).float())


def _every_exponent_field() -> torch.Tensor:
    """float32 values of every exponent field (zeros, subnormals, normals, Inf, NaN) with edge
    and random mantissas, both signs."""
    mantissas = [0, 1, 2, 3, 4, 0x100000, 0x200000, 0x3FFFFF, 0x400000, 0x600000, 0x7FFFFE,
                 0x7FFFFF]  # fmt: skip
    random = torch.randint(0, 1 << 23, (20,), generator=torch.Generator().manual_seed(2))
    fields = torch.arange(256, dtype=torch.int32)[:, None] << 23
    bits = (fields | torch.tensor(mantissas + random.tolist(), dtype=torch.int32)).flatten()
    return torch.cat([bits, bits | torch.iinfo(torch.int32).min]).view(torch.float32)


@pytest.mark.parametrize("mode", ["rne", "away", "ties_up", "up", "sr", "guided"])
@pytest.mark.parametrize("fmt", [*ELEMENT_FORMATS.values(), UE5M3, UE4M3], ids=str)
def test_grid_spacing_from_the_bits_rounds_as_frexp_and_ldexp(fmt, mode, monkeypatch):
    """float32's grid spacing from its exponent field gives round_to_grid's frexp / ldexp
    results bit for bit on every exponent field, Inf and NaN included (the spacing of zero,
    Inf and NaN differs; what they round to does not)."""
    generator = torch.Generator().manual_seed(4)
    x = torch.cat([_every_exponent_field(), torch.randn(4000, generator=generator) * 8])
    uniform = torch.rand(x.shape, generator=generator)
    guide = x + torch.randn(x.shape, generator=generator)
    arguments = {"sr": {"uniform": uniform}, "guided": {"guide": guide}}.get(mode, {})
    from_bits = round_to_grid(x, fmt, mode, **arguments)
    monkeypatch.setattr(minifloat, "FLOAT32_MIN_EXPONENT", 10**6)  # frexp and ldexp alone
    from_frexp = round_to_grid(x, fmt, mode, **arguments)
    assert torch.equal(from_bits.view(torch.int32), from_frexp.view(torch.int32))


def test_float32_rounds_host_numbers_as_torch_casts_them():
    """Ties to even, subnormals, the last finite value, overflow and NaN, as a float32 cast."""
    largest = float(torch.finfo(torch.float32).max)
    half_ulp_above = largest + 2.0**103  # the tie between FLT_MAX and the next power of two
    values = [1 / 3, 1 / 16**0.5, 1 / 6, 1 + 2**-24, 1 + 3 * 2**-24, -(1 + 2**-24), 2**-149 * 0.6,
              2**-150, 1e-50, largest, largest + 2.0**102, half_ulp_above, 1e39, -1e39, 0.0, -0.0,
              float("inf"), float("nan")]  # fmt: skip
    for value in values:
        expected = torch.tensor(value, dtype=torch.float64).to(torch.float32).item()
        got = float32(value)
        assert got == expected or (got != got and expected != expected), value
        assert np.signbit(got) == np.signbit(expected), value
