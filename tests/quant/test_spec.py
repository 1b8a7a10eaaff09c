"""QuantSpec presets (their fields, and each against the oracle) and validation: every bad
field a one-line SpecError."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from tests.quant.test_quantize import SPECS, assert_same, oracle_tensor

# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------

PRESET_FIELDS = {
    "mxfp4": dict(element="e2m1", scale="e8m0", block=32, scale_rule="floor", rounding="rne",
                  tensor_scale=False, tile2d=False, sr_prescale=1.0),
    "mxfp4-ceil": dict(element="e2m1", scale="e8m0", block=32, scale_rule="ceil",
                       rounding="rne", tensor_scale=False, tile2d=False),
    "nvfp4": dict(element="e2m1", scale="ue4m3", block=16, scale_rule="floor", rounding="rne",
                  tensor_scale=True, tile2d=False),
    "mxfp4-ue5m3": dict(element="e2m1", scale="ue5m3", block=32, scale_rule="floor",
                        rounding="rne", tensor_scale=True, tile2d=False),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PRESET_FIELDS))
def test_preset_fields(name):
    spec = QuantSpec.preset(name)
    for field, value in PRESET_FIELDS[name].items():
        assert getattr(spec, field) == value, field


def test_preset_overrides_and_unknown():
    assert QuantSpec.preset("nvfp4", block=32).block == 32
    with pytest.raises(SpecError):
        QuantSpec.preset("no-such-preset")


@pytest.mark.parametrize("preset", list(QuantSpec.PRESETS))
def test_fake_quantize_equals_quantize_dequantize(preset):
    spec = QuantSpec.preset(preset)
    gen = torch.Generator().manual_seed(7)
    for shape in [(16, 64), (48, 37), (33, 16)]:
        x = torch.randn(shape, generator=gen) * torch.logspace(-3, 3, shape[1])
        for axis in (-1, 0):
            fq = fake_quantize(x, spec, axis=axis, seed=11)
            assert_same(quantize(x, spec, axis=axis, seed=11).dequantize(), fq)
            assert_same(fq, oracle_tensor(x, spec, axis=axis, seed=11)[1])


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"element": "e2m2"}, "element"),
        ({"element": "E2M1"}, "element"),
        ({"scale": "e5m3"}, "scale"),
        ({"block": 7}, "block"),
        ({"block": 3}, "block"),
        ({"block": 512}, "block"),
        ({"block": 258}, "block"),
        ({"block": 6}, "block"),
        ({"block": 33}, "block"),
        ({"block": "col"}, "block"),
        ({"block": True}, "block"),
        ({"block": 32.0}, "block"),
        ({"scale_rule": "round"}, "scale_rule"),
        ({"rounding": "nearest"}, "rounding"),
        ({"rounding": "RNE"}, "rounding"),
        ({"sr_prescale": 0.75}, "sr_prescale"),
        ({"sr_prescale": 0.0, "rounding": "sr"}, "sr_prescale"),
        ({"sr_prescale": 1.5, "rounding": "sr"}, "sr_prescale"),
        ({"tensor_scale": True}, "tensor_scale"),
        ({"tensor_scale": True, "scale": "fp32"}, "tensor_scale"),
        ({"tensor_scale": True, "scale": "bf16"}, "tensor_scale"),
        ({"tile2d": True, "block": "row"}, "tile2d"),
        ({"tile2d": True, "block": "tensor"}, "tile2d"),
    ],
    ids=str,
)
def test_spec_validation(changes, field):
    assert issubclass(SpecError, ValueError)
    with pytest.raises(SpecError, match=field):
        QuantSpec(**changes)


def test_valid_specs_construct():
    for spec in SPECS:
        assert QuantSpec(**spec.to_dict()) == spec
    QuantSpec(rounding="sr", sr_prescale=0.75)
    QuantSpec(block=8)
    QuantSpec(block=256, tile2d=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool])
def test_quantize_rejects_integer_tensors(dtype):
    x = torch.ones(4, 32).to(dtype)
    with pytest.raises((TypeError, ValueError)):
        quantize(x, QuantSpec())
    with pytest.raises((TypeError, ValueError)):
        fake_quantize(x, QuantSpec())


@pytest.mark.parametrize("axis", [2, -3, 5])
def test_quantize_rejects_bad_axis(axis):
    with pytest.raises((ValueError, IndexError)):
        quantize(torch.ones(4, 32), QuantSpec(), axis=axis)
    with pytest.raises((ValueError, IndexError)):
        fake_quantize(torch.ones(4, 32), QuantSpec(), axis=axis)


def test_quantized_tensor_metadata():
    x = torch.randn(3, 37, dtype=torch.bfloat16)
    qt = quantize(x, QuantSpec.preset("nvfp4"), axis=0)
    assert qt.shape == x.shape and qt.dtype == torch.bfloat16 and qt.axis == 0
    assert qt.dequantize().dtype == torch.bfloat16
    assert qt.dequantize(torch.float32).dtype == torch.float32
    assert dataclasses.is_dataclass(qt)
