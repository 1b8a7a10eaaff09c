"""The reference quantizer against the independent oracle (tests/oracle.py), bit for bit,
plus hand-derived cases, non-finite and tiny input, and layouts (presets and QuantSpec
validation: test_spec.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.quant.two_level import global_encode_scale
from tests import oracle, oracle_grids

ELEMENTS = ["e2m1", "e3m0", "int4", "e4m3", "e5m2"]
SCALES = ["e8m0", "ue5m3", "ue4m3", "fp32", "bf16"]
TWO_LEVEL_SCALES = ["ue5m3", "ue4m3"]
FP32_MAX = float(torch.finfo(torch.float32).max)
NAN, INF = float("nan"), float("inf")


def assert_same(actual: torch.Tensor, expected: torch.Tensor | np.ndarray) -> None:
    """Bit-exact up to the sign of zero: equal values, NaN where NaN, same dtype and shape."""
    if isinstance(expected, np.ndarray):
        expected = torch.from_numpy(np.ascontiguousarray(expected))
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def oracle_tensor(x: torch.Tensor, spec: QuantSpec, axis: int = -1, seed: int | None = None):
    ref = oracle.reference(x.float().numpy(), spec, axis=axis, seed=seed)
    return ref, torch.from_numpy(ref.out).to(x.dtype)


def decode_codes(codes: torch.Tensor, spec: QuantSpec) -> np.ndarray:
    """Independent decode of QuantizedTensor.codes: unpack low nibble first, look up codes."""
    raw = codes.numpy().astype(np.int64)
    if spec.element in ("e2m1", "e3m0", "int4"):
        raw = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(*raw.shape[:-1], -1)
    table = oracle_grids.code_table(spec.element)
    lookup = np.array([table.get(c, np.nan) for c in range(256)])
    return lookup[raw]


def check_against_oracle(
    x: torch.Tensor, spec: QuantSpec, axis: int = -1, seed: int | None = None
) -> None:
    """fake_quantize, quantize().dequantize(), scales and codes all agree with the oracle."""
    ref, expected = oracle_tensor(x, spec, axis, seed)
    assert_same(fake_quantize(x, spec, axis=axis, seed=seed), expected)
    qt = quantize(x, spec, axis=axis, seed=seed)
    assert_same(qt.dequantize(), expected)
    assert_same(qt.scale_values(), torch.from_numpy(ref.scales))
    # codes: the unpadded part decodes to the oracle's element values (non-finite blocks aside),
    # the padding to zero
    values = decode_codes(qt.codes, spec)
    inner = values[tuple(slice(0, n) for n in ref.q.shape)]
    finite_block = ~np.isnan(ref.q)
    np.testing.assert_array_equal(inner[finite_block], ref.q[finite_block])
    padding = np.ones(values.shape, dtype=bool)
    padding[tuple(slice(0, n) for n in ref.q.shape)] = False
    assert (values[padding] == 0).all()


# --------------------------------------------------------------------------------------------
# The full matrix: element x scale x rule x rounding (x two-level), on many kinds of input
# --------------------------------------------------------------------------------------------


def _specs() -> list[QuantSpec]:
    specs = []
    for element in ELEMENTS:
        for scale in SCALES:
            for rule in ("floor", "ceil"):
                for rounding in ("rne", "away", "ties_up"):
                    for two_level in (False, True) if scale in TWO_LEVEL_SCALES else (False,):
                        specs.append(
                            QuantSpec(
                                element=element,
                                scale=scale,
                                scale_rule=rule,
                                rounding=rounding,
                                tensor_scale=two_level,
                            )
                        )
    # four-over-six on each scale format, one- and two-level, both rules
    for scale in SCALES:
        for rule in ("floor", "ceil"):
            for two_level in (False, True) if scale in TWO_LEVEL_SCALES else (False,):
                specs.append(
                    QuantSpec(
                        scale=scale, scale_rule=rule, tensor_scale=two_level, four_over_six=True
                    )  # fmt: skip
                )
    # MS-EDEN: each two-level scale format, correction groups of one to eight blocks
    for scale in TWO_LEVEL_SCALES:
        for group, prescale in ((16, 1.0), (128, QUARTET2_PRESCALE)):
            specs.append(EDEN.replace(scale=scale, eden_group=group, sr_prescale=prescale))
    specs.append(EDEN.replace(element="int4", block=32, eden_group=64))
    # double-block (an FP32 scale per outer block): each two-level format, with SR-free
    # roundings, four-over-six and MS-EDEN on top
    for scale in TWO_LEVEL_SCALES:
        for rule in ("floor", "ceil"):
            specs.append(QuantSpec.preset("nvfp4-outer128", scale=scale, scale_rule=rule))
    specs.append(QuantSpec.preset("nvfp4-outer128", block=8, outer_block=32, rounding="away"))
    specs.append(QuantSpec.preset("nvfp4-outer128", four_over_six=True))
    specs.append(EDEN.replace(outer_block=64, eden_group=32))
    return specs


EDEN_SEED = 20260124
QUARTET2_PRESCALE = 16 / (17 * 0.93)
EDEN = QuantSpec(scale="ue4m3", block=16, tensor_scale=True, rounding="eden")
SPECS = _specs()


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)))


def _blocks(rows: list[list[float]], width: int = 32) -> torch.Tensor:
    """Rows of blocks (zero-padded to `width`), laid side by side along the last axis."""
    out = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


def case_ties(element: str) -> torch.Tensor:
    """Every grid point and midpoint (both signs) in blocks whose amax is the element max, so
    that the scale is 1 (every scale format); then values past the max (they saturate)."""
    grid = oracle_grids.GRIDS[element].array
    top = grid[-1]
    mids = (grid[:-1] + grid[1:]) / 2
    values = np.concatenate([grid[1:], mids, -grid[1:], -mids])
    rows = [[top, *values[i : i + 31]] for i in range(0, values.size, 31)]
    rows.append([top * 1.0625, top, -top * 1.0625, top * 1.125, top * 13 / 12, top * 7 / 6])
    return _blocks(rows)


def case_zero_blocks(element: str) -> torch.Tensor:
    x = torch.from_numpy(_rng("zero").standard_normal((3, 64)).astype(np.float32))
    x[0] = 0
    x[1, :32] = 0
    x[2, 32:] = -0.0
    return x


def case_single_nonzero(element: str) -> torch.Tensor:
    x = torch.zeros(7, 32)
    for i, v in enumerate([0.3, -5.7e-3, 1234.5, -7.1, 1e-20, 2.5e10, 6.5]):
        x[i, (5 * i) % 32] = v
    return x


def case_subnormal(element: str) -> torch.Tensor:
    rng = _rng("subnormal")
    x = np.zeros((3, 64), dtype=np.float32)
    x[0, :32] = (rng.integers(1, 2**23, 32) * 2.0**-149) * rng.choice([-1, 1], 32)
    x[0, 32:] = 1e-40 * rng.uniform(-1, 1, 32)
    x[1, 5] = 1e-45  # the smallest subnormal
    x[1, 32:] = rng.integers(1, 2**20, 32) * 2.0**-149
    x[1, 40] = 1e-38  # a normal value among subnormals
    x[2] = rng.standard_normal(64)  # keeps the two-level tensor scale finite
    return torch.from_numpy(x)


def case_near_max(element: str) -> torch.Tensor:
    rng = _rng("max")
    x = np.zeros((4, 32), dtype=np.float32)
    x[0, :4] = [3e38, -1.0, 2.9e38, 1.5e38]
    x[1, :3] = [FP32_MAX, -FP32_MAX, 3.3e38]
    x[2] = rng.uniform(-3.4e38, 3.4e38, 32)
    x[3] = rng.uniform(-1, 1, 32) * 1e38
    return torch.from_numpy(x)


def case_huge_and_tiny(element: str) -> torch.Tensor:
    rng = _rng("huge")
    x = rng.standard_normal((2, 96)).astype(np.float32)
    x[:, :32] *= np.float32(1e30)
    x[:, 32:64] *= np.float32(1e-30)
    return torch.from_numpy(x)


def case_random(element: str) -> torch.Tensor:
    rng = _rng("random")
    x = rng.standard_normal((4, 96)) * 10.0 ** rng.uniform(-3, 3, (4, 3)).repeat(32, axis=1)
    return torch.from_numpy(x.astype(np.float32))


def case_nonfinite(element: str) -> torch.Tensor:
    x = torch.from_numpy(_rng("nonfinite").standard_normal((4, 64)).astype(np.float32))
    x[0, 3] = NAN
    x[1, 40] = INF
    x[2, 5] = -INF
    x[2, 6] = NAN
    return x


CASES = {
    "ties": case_ties,
    "zero_blocks": case_zero_blocks,
    "single_nonzero": case_single_nonzero,
    "subnormal": case_subnormal,
    "near_max": case_near_max,
    "huge_and_tiny": case_huge_and_tiny,
    "random": case_random,
    "nonfinite": case_nonfinite,
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.short())
def test_matrix_vs_oracle(spec, case):
    seed = EDEN_SEED if spec.rounding == "eden" else None
    check_against_oracle(CASES[case](spec.element), spec, seed=seed)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.rounding == "rne"], ids=lambda s: s.short())
def test_bf16_input(spec):
    x = torch.cat([case_random(spec.element), case_huge_and_tiny(spec.element)[:, :96]])
    x[0, 0] = NAN
    xb = x.to(torch.bfloat16)
    _, expected = oracle_tensor(xb, spec)
    assert expected.dtype == torch.bfloat16
    got = fake_quantize(xb, spec)
    assert got.dtype == torch.bfloat16
    assert_same(got, expected)
    assert_same(quantize(xb, spec).dequantize(), expected)


# --------------------------------------------------------------------------------------------
# Hand-derived values (no oracle)
# --------------------------------------------------------------------------------------------

# (element max as the anchor: scale 1 in every scale format) value -> rne, away
HAND_TIES = {
    "e2m1": [(0.25, 0, 0.5), (0.75, 1, 1), (1.25, 1, 1.5), (1.75, 2, 2), (2.5, 2, 3),
             (3.5, 4, 4), (5, 4, 6), (7, 6, 6), (0.1, 0, 0), (5.5, 6, 6)],
    "e3m0": [(0.125, 0, 0.25), (0.375, 0.5, 0.5), (0.75, 0.5, 1), (1.5, 2, 2), (3, 2, 4),
             (6, 8, 8), (12, 8, 16)],
    "int4": [(0.5, 0, 1), (1.5, 2, 2), (2.5, 2, 3), (3.5, 4, 4), (4.5, 4, 5), (5.5, 6, 6),
             (6.5, 6, 7), (7.5, 7, 7)],
    "e4m3": [(0.5 * 2**-9, 0, 2**-9), (1.5 * 2**-9, 2 * 2**-9, 2 * 2**-9), (1.0625, 1, 1.125),
             (1.1875, 1.25, 1.25), (464, 448, 448), (9.5, 10, 10), (8.5, 8, 9)],
    "e5m2": [(0.5 * 2**-16, 0, 2**-16), (1.125, 1, 1.25), (1.375, 1.5, 1.5),
             (61440, 57344, 57344), (5, 5, 5), (4.5, 4, 5)],
}  # fmt: skip


@pytest.mark.parametrize("rounding", ["rne", "away"])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("element", ELEMENTS)
def test_hand_ties(element, scale, rounding):
    top = oracle_grids.ELEMENT_MAX[element]
    # values past the max saturate; they would change a non power-of-two scale (amax > max)
    cases = [c for c in HAND_TIES[element] if c[0] <= top or scale == "e8m0"]
    values = [v for v, _, _ in cases]
    want = [rne if rounding == "rne" else away for _, rne, away in cases]
    x = torch.tensor([[top, *values, *[-v for v in values]]], dtype=torch.float32)
    expected = torch.tensor([[top, *want, *[-w for w in want]]], dtype=torch.float32)
    spec = QuantSpec(element=element, scale=scale, rounding=rounding, block=32)
    assert_same(fake_quantize(x, spec), expected)
    assert_same(quantize(x, spec).dequantize(), expected)


@pytest.mark.parametrize(
    ("scale", "smallest"), [("e8m0", 2.0**-127), ("ue5m3", 2.0**-17), ("ue4m3", 2.0**-9)]
)
@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_all_zero_block_gets_smallest_scale(scale, smallest, rule):
    x = torch.zeros(2, 64)
    x[1, 32:] = torch.linspace(-1, 1, 32)
    qt = quantize(x, QuantSpec(scale=scale, scale_rule=rule))
    assert qt.scale_values()[0].tolist() == [smallest, smallest]
    assert qt.scale_values()[1, 0].item() == smallest
    assert (qt.dequantize()[0] == 0).all()
    assert (qt.dequantize()[1, :32] == 0).all()
    assert (qt.codes[0] == 0).all()
    if scale == "e8m0":
        assert qt.scales[0].tolist() == [0, 0]


def test_power_of_two_scale_rules_by_hand():
    x = torch.zeros(4, 32)
    x[0, 0] = 0.3  # floor: 2^(-2-2); ceil: 2^ceil(log2 .05) = 2^-4; 0.3/2^-4 = 4.8 -> 4
    x[1, :2] = torch.tensor([7.5, 1.0])  # floor: s=1, 7.5 clips to 6; ceil: s=2, 3.75 -> 4
    x[2, :2] = torch.tensor([6.0, 0.75])  # both: s=1; 0.75 -> 1 (tie to even)
    x[3, :2] = torch.tensor([12.5, -2.5])  # floor: s=2 (12.5 -> 6.25 -> 6); ceil: s=4
    floor = fake_quantize(x, QuantSpec.preset("mxfp4"))
    ceil = fake_quantize(x, QuantSpec.preset("mxfp4-ceil"))
    assert floor[:, :2].tolist() == [[0.25, 0], [6, 1], [6, 1], [12, -2]]
    assert ceil[:, :2].tolist() == [[0.25, 0], [8, 1], [6, 1], [12, -2]]
    qf = quantize(x, QuantSpec.preset("mxfp4"))
    qc = quantize(x, QuantSpec.preset("mxfp4-ceil"))
    assert qf.scales[:, 0].tolist() == [127 - 4, 127, 127, 128]
    assert qc.scales[:, 0].tolist() == [127 - 4, 128, 127, 129]


def test_mxfp4_codes_by_hand():
    x = torch.zeros(1, 64)
    x[0, :5] = torch.tensor([0.5, 6.0, -0.5, 1.5, 3.0])
    x[0, 32:34] = torch.tensor([-12.0, 1.0])  # scale 2: -12 -> -6 (0b1111), 1 -> 0.5 (0b0001)
    qt = quantize(x, QuantSpec.preset("mxfp4"))
    assert qt.codes.shape == (1, 32)
    assert qt.codes.dtype == torch.uint8
    assert qt.codes[0, :3].tolist() == [0x71, 0x39, 0x05]
    assert qt.codes[0, 16].item() == 0x1F
    assert qt.scales.tolist() == [[127, 128]]


def test_nvfp4_by_hand():
    x = torch.ones(1, 32)
    x[0, 0] = 12.0
    x[0, 16:] = 0.375
    qt = quantize(x, QuantSpec.preset("nvfp4"))
    assert qt.tensor_amax is not None and qt.tensor_amax.item() == 12.0  # G = 448 * 6 / 12 = 224
    # block 0: 12 * (224 * fl(1/6)) = 448.00003 -> scale 448; block 1: 0.375 * 37.333336 =
    # 14.000001 -> scale 14 (tests/quant/test_two_level.py works the order of operations through)
    assert qt.scale_values().tolist() == [[448.0, 14.0]]
    assert torch.equal(qt.dequantize(), x)


# --------------------------------------------------------------------------------------------
# Non-finite input
# --------------------------------------------------------------------------------------------


NONFINITE_SPECS = [QuantSpec.preset(name) for name in QuantSpec.PRESETS] + [
    QuantSpec(block="tensor", scale_rule="ceil"),
    QuantSpec(element="e4m3", scale="ue5m3", block="tensor", tensor_scale=True),
]


@pytest.mark.parametrize("spec", NONFINITE_SPECS, ids=lambda s: s.short())
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nonfinite_poisons_only_its_block(spec, bad):
    x = torch.from_numpy(_rng("poison").standard_normal((32, 64)).astype(np.float32))
    x[3, 17] = 0.0  # so that the finite amax (two-level scale) is the same with and without
    clean = fake_quantize(x, spec, seed=1)
    x[3, 17] = bad
    got = fake_quantize(x, spec, seed=1)
    if spec.block == "tensor":
        poisoned = torch.ones_like(x, dtype=torch.bool)
    elif spec.block == "row":
        poisoned = torch.zeros_like(x, dtype=torch.bool)
        poisoned[3] = True
    elif spec.block == "column":
        poisoned = torch.zeros_like(x, dtype=torch.bool)
        poisoned[:, 17] = True
    elif spec.tile2d:
        b = int(spec.block)
        poisoned = torch.zeros_like(x, dtype=torch.bool)
        poisoned[0:b, b : 2 * b] = True
    else:
        b = int(spec.block)
        poisoned = torch.zeros_like(x, dtype=torch.bool)
        poisoned[3, (17 // b) * b : (17 // b + 1) * b] = True
    assert torch.isnan(got[poisoned]).all()
    assert_same(got[~poisoned], clean[~poisoned])
    assert torch.isnan(quantize(x, spec, seed=1).dequantize()[poisoned]).all()


# --------------------------------------------------------------------------------------------
# Tiny tensors: the two-level scale would overflow float32
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", list(QuantSpec.PRESETS))
@pytest.mark.parametrize("magnitude", [1e-40, 1e-36, 1e-33, 1e-30])
def test_tiny_tensor(preset, magnitude):
    """Finite input never decodes to NaN (only blocks holding NaN/Inf do), also when the
    two-level scale target / amax overflows float32 (it is capped at the float32 max)."""
    spec = QuantSpec.preset(preset)
    x = torch.from_numpy((_rng("tiny").uniform(-1, 1, (16, 40)) * magnitude).astype(np.float32))
    x[:, 3] = 0.0  # zeros (and the padding to whole blocks) are finite too
    got = fake_quantize(x, spec, seed=3)
    assert not torch.isnan(got).any(), f"NaN for finite input of magnitude {magnitude}"
    assert torch.isfinite(got).all()
    assert_same(got, oracle_tensor(x, spec, seed=3)[1])
    if spec.tensor_scale and magnitude <= 1e-36:
        amax = quantize(x, spec).tensor_amax
        assert amax is not None and (global_encode_scale(amax, spec) == FP32_MAX).all()
        if magnitude == 1e-36:  # the capped scale still brings the values into range (at
            assert (got != 0).any()  # 1e-40 the decode factor (s * A) / (S * E) underflows)


# --------------------------------------------------------------------------------------------
# Shapes, axes, block kinds, tiles, layouts
# --------------------------------------------------------------------------------------------

LAYOUT_SPECS = [
    QuantSpec.preset("mxfp4"),
    QuantSpec.preset("nvfp4"),
    QuantSpec(element="int4", scale="ue5m3", scale_rule="ceil"),
    QuantSpec(element="e3m0", scale="bf16", scale_rule="ceil", rounding="away"),
    QuantSpec(element="e4m3", scale="fp32"),
    QuantSpec(element="e5m2", scale="e8m0", scale_rule="ceil"),
]
SHAPES = [
    ((3, 37), -1),
    ((3, 37), 0),
    ((37, 3), 0),
    ((37,), 0),
    ((2, 5, 37), -1),
    ((2, 37, 5), 1),
    ((37, 2, 5), 0),
    ((4, 3, 2, 33), 2),
]


def _random(shape: tuple[int, ...], name: str = "shape") -> torch.Tensor:
    rng = _rng(name + str(shape))
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-2, 2, shape[-1:])
    return torch.from_numpy(x.astype(np.float32))


@pytest.mark.parametrize(("shape", "axis"), SHAPES, ids=str)
@pytest.mark.parametrize("spec", LAYOUT_SPECS, ids=lambda s: s.short())
def test_shapes_and_axes(spec, shape, axis):
    x = _random(shape)
    check_against_oracle(x, spec, axis=axis)
    qt = quantize(x, spec, axis=axis)
    assert qt.dequantize().shape == x.shape
    b = int(spec.block)
    length = shape[axis]
    padded = -(-length // b) * b
    moved = list(shape)
    del moved[axis % len(shape)]
    assert tuple(qt.scales.shape) == (*moved, padded // b)
    per_byte = 2 if spec.packed else 1
    assert tuple(qt.codes.shape) == (*moved, padded // per_byte)


@pytest.mark.parametrize("block", [8, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("spec", LAYOUT_SPECS[:4], ids=lambda s: s.short())
def test_block_sizes(spec, block):
    spec = spec.replace(block=block)
    x = _random((5, 300), "blocks")
    check_against_oracle(x, spec)
    check_against_oracle(x.T.contiguous(), spec, axis=0)
    assert_same(fake_quantize(x.T, spec, axis=0).T, fake_quantize(x, spec))


@pytest.mark.parametrize("kind", ["row", "tensor"])
@pytest.mark.parametrize(("shape", "axis"), [((4, 37), -1), ((4, 37), 0), ((2, 3, 37), 1)])
@pytest.mark.parametrize("spec", LAYOUT_SPECS, ids=lambda s: s.short())
def test_row_and_tensor_blocks(spec, kind, shape, axis):
    spec = spec.replace(block=kind)
    x = _random(shape, kind)
    check_against_oracle(x, spec, axis=axis)
    scales = quantize(x, spec, axis=axis).scale_values()
    if kind == "tensor":
        assert scales.numel() == 1
    else:
        assert scales.numel() == x.numel() // shape[axis]


@pytest.mark.parametrize("block", [8, 16, 32])
@pytest.mark.parametrize(("rows", "cols"), [(40, 56), (33, 70), (16, 16), (5, 3)])
@pytest.mark.parametrize("spec", LAYOUT_SPECS, ids=lambda s: s.short())
def test_tile2d(spec, rows, cols, block):
    spec = spec.replace(block=block, tile2d=True)
    w = _random((rows, cols), "tile")
    check_against_oracle(w, spec, axis=-1)
    check_against_oracle(w, spec, axis=0)
    by_rows = fake_quantize(w, spec, axis=-1)
    # a weight and its transpose quantize identically
    assert_same(fake_quantize(w.T, spec, axis=0).T, by_rows)
    assert_same(fake_quantize(w.T.contiguous(), spec, axis=-1).T, by_rows)
    assert_same(fake_quantize(w, spec, axis=0), by_rows)
    q1, q2 = quantize(w, spec, axis=-1), quantize(w.T, spec, axis=0)
    assert torch.equal(q1.codes, q2.codes)
    assert_same(q1.scale_values(), q2.scale_values())
    assert q1.scale_values().shape == (-(-rows // block), -(-cols // block))


def test_mxfp4_codes_layout():
    x = _random((6, 70), "codes")
    qt = quantize(x, QuantSpec.preset("mxfp4"))
    assert qt.codes.shape == (6, 48) and qt.codes.dtype == torch.uint8  # 70 -> 96 padded
    assert qt.scales.shape == (6, 3) and qt.scales.dtype == torch.uint8
    ref = oracle.reference(x.numpy(), QuantSpec.preset("mxfp4"))
    exponents = np.log2(ref.scales.astype(np.float64))
    assert qt.scales.numpy().astype(np.int64).tolist() == (exponents + 127).astype(int).tolist()
    qt0 = quantize(x.T.contiguous(), QuantSpec.preset("mxfp4"), axis=0)
    assert torch.equal(qt0.codes, qt.codes)  # codes are axis-last
    assert torch.equal(qt0.scales, qt.scales)
