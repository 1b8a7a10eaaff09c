"""Guided (Q-EMA) rounding in the kernels: each value rounds to whichever bracketing grid point
is nearer its guide, bit for bit as the reference (interpreter on the CPU, or a GPU)."""

import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize, quantize
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    MXFP4,
    MXFP4_SR_PRESCALE,
    NAN,
    assert_bits,
    on_device,
    seeded_normal,
)

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")

GUIDED_SPECS = {
    "mxfp4": MXFP4,
    "ceil": QuantSpec.preset("mxfp4-ceil"),
    "sr-prescale": MXFP4_SR_PRESCALE,  # a guide overrides the spec's rounding
    "ue5m3-tensor-scale": QuantSpec.preset("mxfp4-ue5m3"),
    "nvfp4": QuantSpec.preset("nvfp4"),
}


def _pair(shape, seed):
    """x, and a guide near it: mostly within a grid step, some far off, some ties."""
    x = seeded_normal(shape, seed) * torch.exp2(seeded_normal((shape[0], 1), seed + 1) * 3)
    guide = x + seeded_normal(shape, seed + 2) * x.abs() * 0.3
    guide[0] = -x[0]  # the guide on the other side of zero
    guide[1] = x[1]  # guided by itself: nearest-even
    x[2, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    guide[2, :8] = x[2, :8]  # equidistant from both points: the nearest-even choice
    guide[3, 3] = NAN
    x[4, 5] = 0.0
    return on_device(x), on_device(guide)


def _assert_values(actual, expected, what):
    zero = expected == 0  # the reference keeps the sign of a value rounded to zero
    assert_bits(torch.where(zero, 0.0, actual), torch.where(zero, 0.0, expected), what)


@pytest.mark.parametrize("name", GUIDED_SPECS)
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("hadamard", [None, 32])
def test_guided_quantize_matches_the_reference(name, axis, hadamard):
    spec = GUIDED_SPECS[name]
    x, guide = _pair((48, 70), seed=1)
    args = dict(guide=guide, hadamard=hadamard, hadamard_seed=5)
    kernel = quantize(x, spec, axis, backend="triton", **args)
    reference = quantize(x, spec, axis, backend="torch", **args)
    assert_bits(kernel.codes, reference.codes, "codes")
    assert_bits(kernel.scales, reference.scales, "scale codes")
    _assert_values(
        fake_quantize(x, spec, axis, backend="triton", **args),
        fake_quantize(x, spec, axis, backend="torch", **args),
        "values",
    )


def test_guides_change_the_rounding():
    """Against plain nearest rounding, a guide one grid step away moves the values it brackets."""
    x, _ = _pair((32, 64), seed=2)
    guided = fake_quantize(x, MXFP4, guide=x * 2, backend="triton")
    assert not torch.equal(guided, fake_quantize(x, MXFP4, backend="triton"))
    assert torch.equal(fake_quantize(x, MXFP4, guide=x, backend="triton"),
                       fake_quantize(x, MXFP4, backend="triton"))  # fmt: skip


@pytest.mark.parametrize("hadamard", [None, 64])
def test_guided_pair_row_direction(hadamard):
    x, guide = _pair((64, 96), seed=3)
    Direction, quantize_pair = launch_pair.Direction, launch_pair.quantize_pair
    ceil_sr = QuantSpec.preset("mxfp4-ceil", rounding="sr")
    row = Direction(QuantSpec.preset("mxfp4-ceil"), None, hadamard, 9, values_dtype=torch.float32)
    double = None if hadamard else torch.float32  # double quantization reads untransformed rows
    row_out, col_out = quantize_pair(x, row, Direction(ceil_sr, 4), double, guide=guide)
    reference = fake_quantize(x, row.spec, 1, guide=guide, hadamard=hadamard, hadamard_seed=9,
                              backend="torch")  # fmt: skip
    _assert_values(row_out.values, reference, "row values")
    col_reference = quantize(x if hadamard else reference, ceil_sr, 0, seed=4, backend="torch")
    assert_bits(col_out.codes, col_reference.codes, "column codes")


@pytest.mark.parametrize("read_as", [None, torch.bfloat16])
def test_an_average_guide_is_formed_in_the_kernel(read_as):
    """An AverageGuide (the weight average, which guides from `warmup` updates on, the weight
    itself before): the pair's outputs equal those with the guide formed by `values`, before
    and after warm-up, with the weight rounded to bfloat16 as read or not."""
    from fp4cli.techniques.qema import AverageGuide

    x, average = _pair((64, 96), seed=5)
    Direction, quantize_pair = launch_pair.Direction, launch_pair.quantize_pair
    row = Direction(QuantSpec.preset("mxfp4-ceil"), None, values_dtype=torch.float32)
    col = Direction(QuantSpec.preset("mxfp4-ceil", rounding="sr"), 4)
    for count in (2, 3, 9):
        guide = AverageGuide(average, on_device(torch.tensor(count)), 3)
        got = quantize_pair(x, row, col, guide=guide, read_as=read_as)
        source = x if read_as is None else x.to(read_as).float()
        formed = quantize_pair(source, row, col, guide=guide.values(x))
        _assert_values(got[0].values, formed[0].values, f"row values after {count}")
        assert_bits(got[1].codes, formed[1].codes, f"column codes after {count}")
    plain = quantize_pair(x, row, col)[0].values  # before warm-up: nearest-even
    early = quantize_pair(x, row, col, guide=AverageGuide(average, on_device(torch.tensor(0)), 3))
    assert_bits(early[0].values, plain, "before warm-up")
    late = quantize_pair(x, row, col, guide=AverageGuide(average, on_device(torch.tensor(3)), 3))
    assert not torch.equal(late[0].values, plain)  # the average guides


def test_guide_shape_errors():
    x, guide = _pair((16, 32), seed=4)
    with pytest.raises(ValueError, match="guide has shape"):
        quantize(x, MXFP4, guide=guide[:8], backend="triton")
    with pytest.raises(ValueError, match="a guide needs the row direction"):
        launch_pair.quantize_pair(x, None, launch_pair.Direction(MXFP4), guide=guide)


@pytest.mark.parametrize("first_copies", [True, False])
@pytest.mark.parametrize("beta", [0.998, 0.9972, 0.5, 1e-3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ema_update_in_one_pass_is_the_reference(beta, dtype, first_copies):
    """`kernels/elementwise/qema.py` against `update_ema`, bit for bit: the first update copies the
    weight (or, starting from nn.Linear's initialization, blends like the others), later ones round
    both products on their own (no fused multiply-add); non-finite values, subnormals and huge
    values included, a ragged length."""
    from fp4cli.kernels.elementwise.qema import update_ema_kernel
    from fp4cli.techniques.qema import update_ema

    weight = seeded_normal((3, 1001), 4) * torch.exp2(seeded_normal((3, 1), 5) * 20)
    ema = weight + seeded_normal((3, 1001), 6) * weight.abs() * 0.01
    weight[0, :6] = torch.tensor([NAN, float("inf"), -float("inf"), 1e-42, 3e38, -0.0])
    ema[1, :4] = torch.tensor([NAN, 1e-44, -3e38, float("inf")])
    weight = on_device(weight.to(dtype))
    for count in (0, 1, 7):
        updates = on_device(torch.tensor(count))
        got, expected = on_device(ema.clone()), on_device(ema.clone())
        update_ema_kernel(got, weight, beta, updates, first_copies)
        update_ema(expected, weight, beta, updates, first_copies)
        if count == 0 and first_copies:
            copied = torch.nan_to_num(weight.float())
            assert_bits(torch.nan_to_num(expected), copied, "the first update copies")
        assert torch.equal(got.isnan(), expected.isnan())
        assert_bits(torch.nan_to_num(got), torch.nan_to_num(expected), f"ema after {count}")
