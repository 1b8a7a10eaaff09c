"""Stochastic rounding against the oracle's Philox bits: bit-exact, seeded, unbiased."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize, quantize, random_bits
from tests import oracle, oracle_grids, oracle_philox, oracle_scales
from tests.quant.test_quantize import (
    _random,
    _rng,
    assert_same,
    check_against_oracle,
    decode_codes,
)

SR_SPECS = [
    QuantSpec.preset("mxfp4-sr"),
    QuantSpec.preset("mxfp4-sr", scale_rule="ceil"),
    QuantSpec.preset("mxfp4-sr", sr_prescale=0.75),
    QuantSpec.preset("nvfp4", rounding="sr"),
    QuantSpec(element="int4", scale="ue5m3", scale_rule="ceil", rounding="sr"),
    QuantSpec(element="e3m0", scale="bf16", rounding="sr", block=16),
    QuantSpec(element="e4m3", scale="fp32", block="row", rounding="sr"),
]


@pytest.mark.parametrize("spec", SR_SPECS, ids=lambda s: s.short())
def test_sr_matches_oracle_philox(spec):
    """The bits for element i are Philox4x32-10(counter=(i lo, i hi, 0, 0), key=seed), top 24
    bits * 2^-24, i the row-major index in x (quantize's docstring)."""
    x = _random((3, 40, 24), "sr")
    for seed, axis in [(0, -1), (12345, 1), (2**40 + 7, 0)]:
        check_against_oracle(x, spec, axis=axis, seed=seed)


def test_oracle_philox_known_answer():
    zero = np.zeros(1, dtype=np.uint64)
    words = oracle_philox.philox4x32_10((zero, zero, zero, zero), (0, 0))
    assert [int(w[0]) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("count", [1, 7, 64, 4099])
def test_philox_bits_below_a_count_are_each_offsets_own_words(count):
    """With `count`, Philox runs once a counter below ceil(count / 4) and the offsets (in any
    order, repeated, a count that is not a multiple of 4) look up the words that a call per
    offset gives; seeds as tensors too."""
    generator = torch.Generator().manual_seed(count)
    offsets = torch.cat([torch.randperm(count, generator=generator),
                         torch.randint(0, count, (3, 50), generator=generator).flatten(),
                         torch.tensor([0, count - 1])])  # fmt: skip
    for seed in (0, 2**40 + 3, torch.tensor(-5)):
        expected = random_bits.philox_bits(seed, offsets)
        assert torch.equal(random_bits.philox_bits(seed, offsets, count), expected)
        shaped = offsets[: 2 * (offsets.numel() // 2)].reshape(2, -1)
        assert torch.equal(random_bits.uniform(seed, shaped, count),
                           random_bits.uniform(seed, shaped))  # fmt: skip


@pytest.mark.parametrize("spec", SR_SPECS, ids=lambda s: s.short())
def test_sr_reproducible_and_seeded(spec):
    x = _random((8, 96), "seeded")
    a = fake_quantize(x, spec, seed=5)
    assert_same(fake_quantize(x, spec, seed=5), a)
    assert_same(quantize(x, spec, seed=5).dequantize(), a)
    assert not torch.equal(fake_quantize(x, spec, seed=6), a)
    torch.manual_seed(0)
    b = fake_quantize(x, spec)
    torch.manual_seed(0)
    assert_same(fake_quantize(x, spec), b)


def _sr_anchor_tensor(top: float, values: np.ndarray, rows: int) -> torch.Tensor:
    """rows x 32: column 0 holds the anchor `top` (fixing the scale), 1..31 the test values."""
    x = np.empty((rows, 32), dtype=np.float32)
    x[:, 0] = top
    x[:, 1:] = values
    return torch.from_numpy(x)


UNBIASED = [
    # (spec, anchor amax, range of test values); the anchor makes every block's scale fixed
    (QuantSpec.preset("mxfp4-sr"), 6.0, 6.0),
    (QuantSpec.preset("mxfp4-sr", scale_rule="ceil"), 6.0, 6.0),
    (QuantSpec.preset("nvfp4", rounding="sr", block=32), 6.0, 6.0),
    (QuantSpec(element="int4", scale="ue5m3", rounding="sr"), 7.0, 7.0),
    (QuantSpec(element="e3m0", scale="e8m0", rounding="sr"), 16.0, 16.0),
    (QuantSpec(element="e4m3", scale="fp32", rounding="sr"), 448.0, 448.0),
    # the 3/4 pre-scale with the floor rule: amax 7.9 gives scale 1 and 7.9 * 0.75 < 6
    (QuantSpec.preset("mxfp4-sr", sr_prescale=0.75), 7.9, 7.9),
]


@pytest.mark.parametrize(
    ("spec", "anchor", "span"), UNBIASED, ids=[s.short() for s, _, _ in UNBIASED]
)
def test_sr_unbiased(spec, anchor, span):
    rows = 2000
    values = np.linspace(-span * 0.97, span * 0.99, 31).astype(np.float32)
    x = _sr_anchor_tensor(anchor, values, rows)
    got = fake_quantize(x, spec, seed=2024).double()
    mean = got.mean(dim=0)
    std_err = got.std(dim=0) / math.sqrt(rows)
    target = x[0].double()
    # (a grid point has zero variance: it must come back exactly)
    bad = (mean - target).abs() > 4 * std_err
    assert not bad.any(), f"biased at {target[bad].tolist()}: means {mean[bad].tolist()}"


@pytest.mark.parametrize("spec", SR_SPECS, ids=lambda s: s.short())
def test_sr_lands_on_bracketing_grid_points(spec):
    x = _random((64, 64), "bracket")
    rne = spec.replace(rounding="rne", sr_prescale=1.0)
    ref = oracle.reference(x.numpy(), rne)  # the scales do not depend on the rounding
    qt = quantize(x, spec, seed=99)
    assert_same(qt.scale_values(), torch.from_numpy(ref.scales))
    q = decode_codes(qt.codes, spec)[tuple(slice(0, n) for n in ref.q.shape)]
    # element values before rounding, mirroring the float32 order of quant/reference.py
    top = oracle_grids.ELEMENT_MAX[spec.element]
    v = np.clip(_scaled_values(x, spec), -top, top)
    lo, hi = oracle_grids.grid_floor_ceil(v, oracle_grids.GRIDS[spec.element])
    assert ((q == lo) | (q == hi)).all()
    # and the rounding is not always down nor always up
    off_grid = lo != hi
    assert (q[off_grid] == lo[off_grid]).any() and (q[off_grid] == hi[off_grid]).any()


def _scaled_values(x: torch.Tensor, spec: QuantSpec) -> np.ndarray:
    """x / s (times the pre-scale) in float32, moved axis last, unpadded (block along -1)."""
    xs = x.numpy().astype(np.float32)
    if spec.tensor_scale:
        amax = np.float32(np.abs(xs).max())
        ts = (
            np.float32(oracle_scales.scale_max(spec) * oracle_grids.ELEMENT_MAX[spec.element])
            / amax
        )
        xs = (xs * np.float32(ts)).astype(np.float32)
    ref = oracle.reference(x.numpy(), spec.replace(rounding="rne", sr_prescale=1.0))
    if spec.block == "row":
        s = np.repeat(ref.scales, xs.shape[-1], axis=-1)
    else:
        s = np.repeat(ref.scales, int(spec.block), axis=-1)[..., : xs.shape[-1]]
    v = (xs / s).astype(np.float32)
    if spec.sr_prescale != 1.0:
        v = (v * np.float32(spec.sr_prescale)).astype(np.float32)
    return v.astype(np.float64)


def test_sr_prescale_never_clips():
    """Floor rule + 3/4 pre-scale: every element is strictly inside the grid before rounding,
    so values in (6, 8) * scale are not clipped (their mean comes back)."""
    spec = QuantSpec.preset("mxfp4-sr", sr_prescale=0.75)
    rng = _rng("clip")
    x = rng.uniform(-1, 1, (512, 32)).astype(np.float32) * 10.0 ** rng.uniform(-3, 3, (512, 1))
    v = _scaled_values(torch.from_numpy(x.astype(np.float32)), spec)
    assert np.abs(v).max() <= 6.0
    values = np.linspace(6.05, 7.95, 31).astype(np.float32)
    big = _sr_anchor_tensor(7.99, values, 2000)
    got = fake_quantize(big, spec, seed=1).double()
    mean = got[:, 1:].mean(dim=0)
    std_err = got[:, 1:].std(dim=0) / math.sqrt(2000)
    assert ((mean - torch.from_numpy(values).double()).abs() <= 4 * std_err).all()
