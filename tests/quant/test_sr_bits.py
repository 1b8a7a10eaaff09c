"""Stochastic rounding's resolution (`QuantSpec.sr_bits`) in the reference: the carry rule at 8
and 16 bits (Blackwell's `cvt.rs`), its random fields, its bias, and the spec's checks."""

import math

import pytest
import torch

from fp4cli.formats import E2M1, ELEMENT_FORMATS
from fp4cli.formats.minifloat import round_to_grid
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, random_bits

E1M2 = ELEMENT_FORMATS["e1m2"]
GRID_INTERVALS = [(0.0, 0.5), (1.5, 0.5), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0)]  # (lower, step)


@pytest.mark.parametrize("bits", [8, 16])
def test_a_field_of_the_word_of_index_over_fields(bits):
    """Offset i takes field i mod (32 / bits) of the word offset i // (32 / bits) draws, the
    lowest field first: one Philox call serves 128 / bits offsets."""
    per = 32 // bits
    offsets = torch.arange(200, dtype=torch.int64)
    fields = random_bits.carry_fields(77, offsets, 200, bits)
    words = random_bits.philox_bits(77, offsets // per)
    expected = (words >> (bits * (offsets % per))) & ((1 << bits) - 1)
    assert torch.equal(fields, expected) and int(fields.max()) < 1 << bits
    unordered = random_bits.carry_fields(77, offsets.flip(0), None, bits)
    assert torch.equal(unordered, fields.flip(0))  # with or without the count
    uniform = random_bits.uniform_at(77, offsets, 200, bits)
    assert torch.equal(uniform, fields.to(torch.float32) / 2**bits)
    at_24 = random_bits.uniform_at(77, offsets, 200, 24)
    assert torch.equal(at_24, random_bits.uniform(77, offsets))


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize(("lower", "step"), GRID_INTERVALS)
def test_carry_rounds_up_floor_of_the_fraction_of_its_random_numbers(bits, lower, step):
    """Over every one of the 2^bits random numbers, a value f of a step above a grid point rounds
    up for floor(2^bits f) of them: f is resolved to 2^-bits and truncated, never rounded up."""
    levels = 2**bits
    u = torch.arange(levels, dtype=torch.float32) / levels
    for fraction in (1 / 512, 1 / 256, 3 / 1024, 0.25, 0.5, 0.75, 255 / 256, 1 - 2**-20):
        x = torch.full((levels,), lower + fraction * step)
        up = (round_to_grid(x, E2M1, "sr_carry", uniform=u) > lower).sum().item()
        assert up == math.floor(levels * fraction), (fraction, up)


def test_a_value_a_512th_of_a_step_above_a_grid_point_never_rounds_up_at_8_bits():
    """The bias of 8 bits: at 1/512 of a step the carry never comes; at 24 bits the value rounds
    up about once in 512 (the measured rates over 2^17 draws)."""
    x = torch.full((1 << 17,), 2.0 + 1.0 / 512)  # grid step 1 above 2
    spec8 = QuantSpec(scale="ue4m3", block=16, rounding="sr", sr_bits=8, tensor_scale=True)
    anchor = torch.full((1 << 17, 1), 6.0)
    blocks = torch.cat([anchor, x.reshape(-1, 1).expand(-1, 15)], dim=1)
    rates = {}
    for bits in (8, 24):
        rounded = fake_quantize(blocks, spec8.replace(sr_bits=bits), seed=5, backend="torch")
        rates[bits] = (rounded[:, 1:] > 2.0).double().mean().item()
    assert rates[8] == 0.0
    assert abs(rates[24] - 1 / 512) < 0.0004


@pytest.mark.parametrize("bits", [8, 16, 24])
def test_rounding_is_unbiased_to_its_resolution(bits):
    """Over 64 seeds, the mean of each value's roundings is within 2^-bits of a step below it
    (the carry truncates: its bias is at most one level, downward) plus sampling noise; 24 bits'
    bias is below 8 bits' bound."""
    values = torch.linspace(0.013, 5.97, 61)
    x = torch.cat([torch.full((1,), 6.0), values]).expand(256, -1).contiguous()  # scale 1
    spec = QuantSpec(block=32, rounding="sr", sr_bits=bits).replace(block="row")
    total = torch.zeros(61, dtype=torch.float64)
    seeds = 64
    for seed in range(seeds):
        total += fake_quantize(x, spec, seed=seed, backend="torch")[:, 1:].double().sum(0)
    mean = total / (seeds * 256)
    step = torch.where(values >= 4, 2.0, torch.where(values >= 2, 1.0, 0.5)).double()
    noise = 5 * step / (2 * (seeds * 256) ** 0.5)
    bias = (mean - values.double()) / step
    assert (bias >= -(2.0**-bits) - noise / step).all() and (bias <= noise / step).all()
    if bits == 24:
        assert (bias.abs() <= 2.0**-8 + noise / step).all()


def test_saturation_zeros_and_signs_under_the_carry():
    x = torch.tensor([6.0, 7.9, -7.9, 0.0, -0.0, 0.26, -5.9, 1e-30])
    for u in (0.0, 0.99609375):
        q = round_to_grid(x, E2M1, "sr_carry", uniform=torch.full_like(x, u))
        assert q[0] == 6 and q[1] == 6 and q[2] == -6
        assert q[3].item() == 0 and not torch.signbit(q[3]) and torch.signbit(q[4])
        assert torch.signbit(q[6]) and q[7] >= 0
    assert round_to_grid(x, E1M2, "sr_carry", uniform=torch.full_like(x, 0.99))[1] == 3.5


def test_same_seed_same_bits_other_seed_other_bits():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) * 3
    spec = QuantSpec.preset("nvfp4", rounding="sr", sr_bits=8)
    first = fake_quantize(x, spec, seed=3, backend="torch")
    assert torch.equal(first, fake_quantize(x, spec, seed=3, backend="torch"))
    assert not torch.equal(first, fake_quantize(x, spec, seed=4, backend="torch"))
    assert not torch.equal(first, fake_quantize(x, spec.replace(sr_bits=16), seed=3))


def test_the_spec_refuses_what_the_carry_is_not_defined_for():
    with pytest.raises(SpecError, match="sr_bits: must be one of 8, 16, 24"):
        QuantSpec(rounding="sr", sr_bits=12)
    with pytest.raises(SpecError, match="sr_bits: only applies with rounding 'sr'"):
        QuantSpec(sr_bits=8)
    with pytest.raises(SpecError, match="sr_bits 8: rounds e2m1 or e1m2 elements"):
        QuantSpec.preset("fp8-e4m3", rounding="sr", sr_bits=8)
    with pytest.raises(SpecError, match="must be one of"):
        QuantSpec(rounding="sr", sr_bits=True)
    assert QuantSpec(rounding="sr", sr_bits=8).short().endswith("/8bits")
    assert "bits" not in QuantSpec(rounding="sr").short()
