"""The dequantize and amax kernels, backend dispatch, and QuantLinear on the kernels against the
reference. (See tests/kernels/test_kernels.py.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

import fp4cli
from fp4cli.linear.fast import fast_gap
from fp4cli.linear.fast_vector import vector_gap
from fp4cli.linear.operands import OPERANDS
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.backend import kernel_gap, scale_rule_gap
from fp4cli.techniques.hadamard import rht
from tests.kernel_cases import (
    DEVICE,
    INF,
    MXFP4,
    MXFP4_SR_PRESCALE,
    NAN,
    NVFP4_SR,
    SPECS,
    assert_bits,
    assert_same_quantized,
    assert_same_up_to_zero_sign,
    check_backends_agree,
    finite_amax,
    on_device,
    seeded_normal,
    tensor_amax,
)
from tests.kernel_checks import assert_same_sum

# numpy warns about the Inf and NaN that non-finite blocks and saturating lanes compute in the
# interpreter, and that the kernels then discard.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


# --------------------------------------------------------------------------------------------
# The dequantize kernel on the reference's codes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize(
    "spec_name", ["mxfp4", "mxfp4-sr-prescale0.75", "nvfp4", "ue5m3-ceil-ts-sr", "ue4m3-ceil"]
)
def test_dequantize_kernel_on_reference_codes(spec_name, axis):
    spec = SPECS[spec_name]
    x = seeded_normal((37, 45), 19) * 10.0 ** torch.linspace(-3, 3, 45)
    x[3, 4], x[10, 40] = NAN, -INF  # NaN blocks
    reference = quantize(on_device(x), spec, axis=axis, seed=2, backend="torch")
    for dtype in (None, torch.float32, torch.float16):
        assert_bits(
            reference.dequantize(dtype, backend="triton"),
            reference.dequantize(dtype, backend="torch"),
            f"dequantize({dtype})",
        )
    assert reference.dequantize(backend="triton").isnan().any()


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("spec_name", ["mxfp4", "mxfp4-sr-prescale0.75", "nvfp4", "ue5m3-ceil"])
def test_dequantize_kernel_every_code(spec_name, axis):
    """Every E2M1 code under every scale code (NaN codes and codes no quantizer writes
    included), against the reference's decoding, up to the sign of zero: code 8 (-0, which no
    quantizer writes) decodes to -0.0 in the reference and the interpreter, but to +0.0 compiled
    on a GPU (Triton lowers unary minus to 0 - x there)."""
    spec = SPECS[spec_name]
    block = int(spec.block)
    lines, length = 256, 64
    shape = (lines, length) if axis == -1 else (length, lines)
    template = quantize(on_device(torch.ones(shape)), spec, axis=axis, backend="torch")
    line = torch.arange(lines).unsqueeze(1)
    # 32 bytes per line; over 8 lines they run through all 256 bytes, so each block holds all
    # 16 codes in its low nibbles
    codes = ((torch.arange(length // 2) + 32 * line) % 256).to(torch.uint8)
    blocks = torch.arange(length // block)
    scales = ((line + 128 * blocks) % 256).to(torch.uint8)  # block 0 of line c: scale code c
    crafted = dataclasses.replace(template, codes=on_device(codes), scales=on_device(scales))
    assert_same_up_to_zero_sign(
        crafted.dequantize(backend="triton"), crafted.dequantize(backend="torch"), "all codes"
    )


# --------------------------------------------------------------------------------------------
# tensor_amax
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "axis"), [((5, 70), 1), ((70, 5), 0), ((3, 40, 6), 1)], ids=str)
def test_tensor_amax_ignores_nan_and_inf(shape, axis):
    x = seeded_normal(shape, 20) * 1e3
    x.view(-1)[[1, 50, 99]] = torch.tensor([NAN, INF, -INF])
    x.view(-1)[123] = -5e4  # the largest finite magnitude, negative
    x = on_device(x)
    amax = tensor_amax(x, axis, None, 0)
    assert amax.item() == 5e4
    assert_bits(amax, finite_amax(x), "amax")
    assert tensor_amax(on_device(torch.full(shape, NAN)), axis, None, 0).item() == 0.0


@pytest.mark.parametrize("size", [16, 64, 128])
@pytest.mark.parametrize(("shape", "axis"), [((5, 70), 1), ((70, 5), 0)], ids=str)
def test_tensor_amax_of_the_hadamard_transform(shape, axis, size):
    x = seeded_normal(shape, 21)
    x[2, 3] = NAN
    x = on_device(x)
    for hadamard_seed in (0, 2**63 + 1):  # tensor seeds: test_hadamard_tensor_seeds
        transformed = rht(x, axis, size, hadamard_seed)
        assert_bits(tensor_amax(x, axis, size, hadamard_seed), finite_amax(transformed))


# --------------------------------------------------------------------------------------------
# Backend dispatch
# --------------------------------------------------------------------------------------------


def test_unknown_backend_is_an_error():
    x = on_device(torch.ones(2, 32))
    for call in (
        lambda: quantize(x, MXFP4, backend="cuda"),
        lambda: fake_quantize(x, MXFP4, backend="Triton"),
        lambda: quantize(x, MXFP4, backend="torch").dequantize(backend="numpy"),
        lambda: fp4cli.QuantLinear(32, 8, config=fp4cli.LinearConfig(MXFP4), backend="gpu"),
    ):
        with pytest.raises(SpecError, match="backend"):
            call()


UNCOVERED = [
    # (spec, words the error names)
    (QuantSpec(element="int4"), "element 'int4'"),
    (QuantSpec.preset("nvfp4-2d"), "tile2d"),
    (QuantSpec(block="row"), "block 'row'"),
    (QuantSpec(block="tensor", scale_rule="ceil"), "block 'tensor'"),
    (QuantSpec(scale="fp32"), "scale 'fp32'"),
]


@pytest.mark.parametrize(("spec", "named"), UNCOVERED, ids=[u[1] for u in UNCOVERED])
@pytest.mark.parametrize("guided", [False, True])
def test_triton_backend_refuses_what_it_does_not_cover(spec, named, guided):
    x = on_device(seeded_normal((16, 32), 22))
    guide = x * 1.1 if guided else None
    with pytest.raises(SpecError, match=named):
        quantize(x, spec, guide=guide, backend="triton")
    with pytest.raises(SpecError, match=named):
        fake_quantize(x, spec, guide=guide, backend="triton")
    # auto falls back to the reference for it
    assert_bits(
        fake_quantize(x, spec, guide=guide, backend="auto"),
        fake_quantize(x, spec, guide=guide, backend="torch"),
    )


def test_triton_backend_refuses_float64_input():
    with pytest.raises(SpecError, match="dtype"):
        fake_quantize(on_device(torch.ones(2, 32, dtype=torch.float64)), MXFP4, backend="triton")


def test_auto_backend_runs_the_reference_on_a_cpu_tensor(monkeypatch):
    import fp4cli.kernels.quantization.launch as launch

    def no_kernel(*args, **kwargs):
        raise RuntimeError("a kernel was launched")

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernels could run: auto must not choose them
    monkeypatch.setattr(launch, "quantize_e2m1", no_kernel)
    monkeypatch.setattr(launch, "dequantize_e2m1", no_kernel)
    x = seeded_normal((4, 40), 23)
    for spec in (MXFP4, NVFP4_SR):
        auto = quantize(x, spec, seed=1, backend="auto")
        assert_same_quantized(auto, quantize(x, spec, seed=1, backend="torch"))
        assert_bits(auto.dequantize(backend="auto"), auto.dequantize(backend="torch"))
        assert_bits(
            fake_quantize(x, spec, seed=1, hadamard=16, backend="auto"),
            fake_quantize(x, spec, seed=1, hadamard=16, backend="torch"),
        )
    with pytest.raises(RuntimeError, match="a kernel was launched"):  # the patch is in place
        quantize(x, MXFP4, backend="triton")


@pytest.mark.parametrize("interpret", [None, "0", ""])
def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch, interpret):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    x = seeded_normal((4, 32), 24)
    with pytest.raises(SpecError, match="TRITON_INTERPRET"):
        quantize(x, MXFP4, backend="triton")
    with pytest.raises(SpecError, match="TRITON_INTERPRET"):
        fake_quantize(x, MXFP4, backend="triton")
    with pytest.raises(SpecError, match="TRITON_INTERPRET"):
        quantize(x, MXFP4, backend="torch").dequantize(backend="triton")
    assert_bits(fake_quantize(x, MXFP4, backend="auto"), fake_quantize(x, MXFP4, backend="torch"))


def test_float16_input_and_output():
    """float16 in and out (the interpreter computes float16 as the GPU does; bfloat16 not)."""
    x = seeded_normal((6, 45), 25) * 100
    x[0, 0] = NAN
    check_backends_agree(on_device(x.half()), NVFP4_SR, seed=3)
    check_backends_agree(on_device(x), MXFP4_SR_PRESCALE, seed=3, out_dtype=torch.float16)


# --------------------------------------------------------------------------------------------
# QuantLinear and quantize_model
# --------------------------------------------------------------------------------------------


def recipe_kernel_gaps(name: str) -> list[str]:
    """Why the kernels cannot run some operand of a shipped recipe (empty: they run all, one
    operand at a time or on the fast executor)."""
    config = fp4cli.load_recipe(name).linear
    if fast_gap(config) is None:
        return []
    gaps = []
    for operand in OPERANDS:
        spec = config.spec(operand)
        if spec is None:
            continue
        gap = kernel_gap(spec, torch.float32)
        if gap is not None:
            gaps.append(f"{operand}: {gap}")
    return gaps


QUANTIZED_RECIPES = [
    name for name in fp4cli.list_recipes() if not fp4cli.load_recipe(name).linear.is_high_precision
]
COVERED_RECIPES = [name for name in QUANTIZED_RECIPES if not recipe_kernel_gaps(name)]
UNCOVERED_RECIPES = [name for name in QUANTIZED_RECIPES if recipe_kernel_gaps(name)]


def test_recipe_coverage_is_what_the_kernels_cover():
    """COVERED_RECIPES / UNCOVERED_RECIPES come from kernel_gap; pin the recipes that must be
    on each side, so that neither parametrization can quietly lose them."""
    assert {"mxfp4", "tseng-rht-sr", "tetrajet", "ue5m3-hadamard-sr"} <= set(COVERED_RECIPES)
    assert "tseng-baseline" in COVERED_RECIPES  # ties away from zero
    assert "nvfp4" in COVERED_RECIPES  # 2-D weight tiles: on the fast executor only
    assert "wang-fp4" in UNCOVERED_RECIPES
    assert "tetrajet-qema" in COVERED_RECIPES
    assert "ufp4" in COVERED_RECIPES  # E1M2 elements
    assert {"tetrajet-v2", "quartet2"} <= set(COVERED_RECIPES)  # outer blocks, MS-EDEN


def training_step(recipe: str | fp4cli.LinearConfig, backend: str) -> list[torch.Tensor]:
    """Output, input grad and parameter grads of one forward/backward pass of a linear layer
    under `recipe` (all three GEMMs, six operands); 48 in, 26 out, 36 tokens: padded blocks,
    0-d tensor seeds (the layer's seed buffer), and per-element SR bits along the tokens for
    the 26-wide dY."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 26)).to(DEVICE)
    fp4cli.quantize_model(model, recipe, seed=11, skip=(), backend=backend)
    assert isinstance(model[0], fp4cli.QuantLinear)
    x = torch.randn(36, 48, device=DEVICE, requires_grad=True)
    y = model(x)
    y.backward(torch.randn(36, 26, device=DEVICE))
    return [y.detach(), x.grad, *(parameter.grad for parameter in model.parameters())]


@pytest.mark.parametrize("recipe", COVERED_RECIPES)
def test_quant_linear_triton_equals_torch(recipe, monkeypatch):
    import fp4cli.kernels.quantization.launch as launch
    import fp4cli.kernels.quantization.launch_pair as launch_pair

    kernel_calls = []
    for module, name in ((launch, "quantize_e2m1"), (launch_pair, "quantize_pair")):
        real = getattr(module, name)

        def counting(*args, real=real, **kwargs):
            kernel_calls.append(args[1])
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    reference_results = training_step(recipe, "torch")
    assert not kernel_calls
    kernel_results = training_step(recipe, "triton")
    assert kernel_calls, "backend='triton' launched no kernel"
    names = ["y", "x.grad", "weight.grad", "bias.grad"]
    for name, kernel_result, reference_result in zip(
        names, kernel_results, reference_results, strict=True
    ):
        if name == "bias.grad":  # dY's column sums, added in the fast executor's order
            assert_same_sum(kernel_result, reference_result, f"{recipe}: {name}")
        else:
            assert_bits(kernel_result, reference_result, f"{recipe}: {name}")


def fitted_scale_operands(linear: fp4cli.LinearConfig) -> list[str]:
    """The operands whose scales a fitted rule (QuEST's rms, std) computes: no kernel fits them."""
    specs = {name: linear.spec(name) for name in OPERANDS}
    return [name for name, spec in specs.items() if spec is not None and scale_rule_gap(spec)]


def test_every_shipped_recipe_runs_on_kernels():
    """The recipes the quantize kernels do not cover are the vector-wise executor's (wang-fp4,
    wang-direct: tests/train/test_fast_vector.py), or fit their forward scales to the blocks'
    RMS (quest, quartet), which only the reference computes."""
    fitted = set()
    for name in UNCOVERED_RECIPES:
        linear = fp4cli.load_recipe(name).linear
        if fitted_scale_operands(linear):
            fitted.add(name)
        else:
            assert vector_gap(linear) is None, name
    assert fitted == {"quest", "quartet"}
    assert fitted_scale_operands(fp4cli.load_recipe("quartet").linear) == ["forward_x", "forward_w"]


NVFP4_SPEC = QuantSpec.preset("nvfp4")
REFUSED_SPECS = {
    "ties-up": NVFP4_SPEC.replace(rounding="ties_up"),
    "outer-block-48": QuantSpec.preset("nvfp4-outer128", outer_block=48),
    "eden-group-48": QuantSpec.preset("nvfp4-eden", eden_group=48),
}


@pytest.mark.parametrize("name", REFUSED_SPECS)
def test_quant_linear_triton_refuses_an_uncovered_spec(name):
    spec = REFUSED_SPECS[name]
    config = fp4cli.LinearConfig(forward_x=NVFP4_SPEC, forward_w=NVFP4_SPEC, grad_input_dy=spec)
    with pytest.raises(SpecError, match="backend 'triton' does not cover"):
        training_step(config, "triton")
