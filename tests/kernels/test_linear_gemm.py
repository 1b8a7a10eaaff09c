"""`gemm: exact | fast` (fp4cli/linear/routes.py). The fast executor hands `mxfp4_matmul` the
packed operands of every GEMM whose two specs its kernels take: the operands must be the
reference executor's bit for bit (each GEMM computes A @ B^T; the values of A and B are
compared), and the products the reference's up to float32 summation order. A GEMM of two NVFP4
operands multiplies their block values as Blackwell does, on both executors: the same bits,
and nvfp4_matmul's contract."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import fp4cli.gemm
from fp4cli import LinearConfig, QuantSpec, quantize_model
from fp4cli.gemm import nvfp4_matmul_reference
from fp4cli.linear.routes import gemm_gap, gemm_route
from fp4cli.quant import quantize
from fp4cli.recipes import load_recipe
from fp4cli.replay import replays
from fp4cli.techniques import HadamardConfig
from tests.kernel_cases import DEVICE
from tests.kernel_checks import assert_same_sum, assert_same_up_to_zero_sign
from tests.kernels.test_linear_fast import CONFIGS
from tests.linear_runs import (
    assert_same_passes,
    linear_inputs,
    saved_tensors,
    seeded_layer,
    training_passes,
)

MXFP4 = QuantSpec.preset("mxfp4")
NVFP4 = QuantSpec.preset("nvfp4")
ROUTED = {
    "mxfp4": CONFIGS["mxfp4"],
    "tetrajet": CONFIGS["tetrajet"],  # ceil scales, SR, double quantization
    "tetrajet-qema": CONFIGS["tetrajet-qema"],  # the forward weight's guided rounding
    "double-quant-rht": CONFIGS["double-quant-rht"],  # RHT-32 on the weight gradient
    "wide-rht": CONFIGS["wide-rht"],  # RHT-256 and -128: two launches per tensor
    "rht-forward": LinearConfig(
        forward_x=MXFP4.replace(block=64),
        forward_w=MXFP4.replace(block=64),
        grad_input_dy=MXFP4,
        grad_input_w=MXFP4,
        forward_hadamard=HadamardConfig(64),
    ),
}


def with_gemm(config: LinearConfig, mode: str) -> LinearConfig:
    return dataclasses.replace(config, gemm=mode)


def gemm_operands(layer, x, grad_y) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(how, A, B) of every matrix product of one training pass, as the values of A and B with
    the product A @ B^T: torch's GEMMs on values, or `mxfp4_matmul` on packed operands."""
    products = []
    real_mm, real_linear, real_matmul = torch.Tensor.mm, F.linear, fp4cli.gemm.mxfp4_matmul

    def mm(a, b):
        products.append(("values", a.float(), b.t().float()))
        return real_mm(a, b)

    def linear(a, w, bias=None):
        products.append(("values", a.float(), w.float()))
        return real_linear(a, w, bias)

    def matmul(a, b, **kwargs):
        products.append((kwargs["mode"], a.dequantize(torch.float32), b.dequantize(torch.float32)))
        return real_matmul(a, b, **kwargs)

    with pytest.MonkeyPatch.context() as patch, replays(False):  # the Python calls
        patch.setattr(torch.Tensor, "mm", mm)
        patch.setattr(F, "linear", linear)
        patch.setattr(fp4cli.gemm, "mxfp4_matmul", matmul)
        training_passes(layer, x, grad_y, calls=1)
    return products


def routed_pair(config, shape=(2, 37, 96), out_features=70, seed=0):
    """(fast layer, reference layer, x, grad_y) for `config`."""
    in_features = shape[-1]
    fast = seeded_layer(config, "triton", in_features, out_features)
    reference = seeded_layer(config, "torch", in_features, out_features)
    return fast, reference, *linear_inputs(shape, out_features, seed=seed)


@pytest.mark.parametrize("name", ROUTED)
def test_mxfp4_matmul_gets_the_reference_operands(name):
    config = with_gemm(ROUTED[name], "exact")
    fast, reference, x, grad_y = routed_pair(config)
    assert fast.executor() == ("fast", "")
    got, expected = gemm_operands(fast, x, grad_y), gemm_operands(reference, x, grad_y)
    routed = [gemm_gap(config, gemm) is None for gemm in ("forward", "grad_input", "grad_weight")]
    assert [how != "values" for how, _, _ in got] == routed
    assert all(how == "values" for how, _, _ in expected)
    for (how, a, b), (_, a_ref, b_ref) in zip(got, expected, strict=True):
        assert_same_up_to_zero_sign(a, a_ref, f"{how} A")
        assert_same_up_to_zero_sign(b, b_ref, f"{how} B")


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("name", ["mxfp4", "tetrajet", "rht-forward"])
def test_products_are_the_reference_sums(name, mode):
    """Exact mode sums the same products in another order; fast mode flushes nothing on
    ordinary data (and the interpreter's dots sum exactly)."""
    fast, reference, x, grad_y = routed_pair(with_gemm(ROUTED[name], mode))
    got, expected = (training_passes(layer, x, grad_y, calls=1) for layer in (fast, reference))
    for got_call, expected_call in zip(got, expected, strict=True):
        for index, (a, b) in enumerate(zip(got_call, expected_call, strict=True)):
            assert_same_sum(a, b, f"output {index}")


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_the_forward_gemm_adds_the_bias_before_rounding(mode):
    """The bias goes into the forward product's epilogue (in the compute dtype, as F.linear
    takes it under autocast), not onto the rounded product; the backward products take none."""
    fast, _, x, grad_y = routed_pair(with_gemm(ROUTED["mxfp4"], mode))
    biases = []
    real_matmul = fp4cli.gemm.mxfp4_matmul

    def matmul(a, b, **kwargs):
        biases.append(kwargs.get("bias"))
        return real_matmul(a, b, **kwargs)

    with pytest.MonkeyPatch.context() as patch, replays(False):  # the Python calls
        patch.setattr(fp4cli.gemm, "mxfp4_matmul", matmul)
        training_passes(fast, x, grad_y, calls=1)
    assert len(biases) == 3 and biases[1] is None and biases[2] is None
    assert torch.equal(biases[0], fast.bias.detach().to(x.dtype))


@pytest.mark.parametrize("name", ["tetrajet", "wide-rht"])
def test_ragged_tokens_and_features(name):
    """45 input and 33 output features, 19 tokens: K padded to whole blocks (and transforms)
    on both operands of every GEMM."""
    config = with_gemm(ROUTED[name], "exact")
    fast, reference, x, grad_y = routed_pair(config, (19, 45), 33, seed=2)
    got, expected = gemm_operands(fast, x, grad_y), gemm_operands(reference, x, grad_y)
    assert [how for how, _, _ in got] == ["exact"] * 3
    for (_, a, b), (_, a_ref, b_ref) in zip(got, expected, strict=True):
        assert_same_up_to_zero_sign(a, a_ref, "A")
        assert_same_up_to_zero_sign(b, b_ref, "B")
    passes = [training_passes(layer, x, grad_y, calls=1)[0] for layer in (fast, reference)]
    for a, b in zip(*passes, strict=True):
        assert_same_sum(a, b)


def test_no_bias_and_no_input_gradient():
    config = with_gemm(CONFIGS["tetrajet"], "exact")
    layers = [seeded_layer(config, backend, bias=False) for backend in ("triton", "torch")]
    x, grad_y = linear_inputs((29, 96), seed=4)
    x.requires_grad_(False)
    got, expected = (training_passes(layer, x, grad_y, calls=1)[0] for layer in layers)
    assert got[1] is None and expected[1] is None
    for a, b in zip(got[::2], expected[::2], strict=True):
        assert_same_sum(a, b)


def test_weight_operand_is_kept_packed():
    """W's grad_input operand is kept as codes and scale codes when its GEMM takes
    mxfp4_matmul (as values otherwise), X's as before."""
    x, _ = linear_inputs(seed=6)
    saved = saved_tensors(seeded_layer(with_gemm(CONFIGS["mxfp4"], "fast"), "triton"), x)
    # X: (in, tokens / 2) codes and (in, tokens / 32) scales (74 tokens padded to 96);
    # W (70, 96) blocked along out: (in, 96 / 2) codes and (in, 96 / 32) scales; the call's seed
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [((96, 3), torch.uint8), ((96, 48), torch.uint8)] * 2 + [((), torch.int64)]
    )


def test_gemm_gap_says_why_a_gemm_multiplies_values():
    tseng = with_gemm(load_recipe("tseng-rht-sr").linear, "fast")
    assert gemm_gap(tseng, "forward") == "forward_x in high precision"
    assert gemm_gap(tseng, "grad_input") == (
        "grad_input_dy's sr_prescale 0.75 (dequantized values are not q * 2^e)"
    )
    assert gemm_gap(with_gemm(load_recipe("nvfp4").linear, "exact"), "forward") is None
    mixed = LinearConfig(forward_x=MXFP4, forward_w=MXFP4.replace(block=64), gemm="exact")
    assert gemm_gap(mixed, "forward") == "blocks of 32 and 64 (both operands need one block)"
    assert gemm_gap(CONFIGS["mxfp4"], "forward") == "gemm: dequantized"
    assert gemm_gap(with_gemm(CONFIGS["mxfp4"], "fast"), "grad_weight") is None


def test_executor_summary_says_where_each_gemm_runs():
    from fp4cli.linear import executor_summary

    def summary(recipe, mode):
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)).to(DEVICE)
        config = with_gemm(load_recipe(recipe).linear, mode)
        quantize_model(model, config, seed=0, skip=(), backend="triton")
        return executor_summary(model)

    assert summary("mxfp4", "dequantized") == "quantized layers: 2 on the fast executor"
    assert summary("tetrajet", "fast") == (
        "quantized layers: 2 on the fast executor; "
        "gemm fast: forward, grad_input, grad_weight on mxfp4_matmul"
    )
    assert summary("tseng-rht-sr", "exact").endswith(
        "gemm exact: forward on values (forward_x in high precision); grad_input on values "
        "(grad_input_dy's sr_prescale 0.75 (dequantized values are not q * 2^e)); grad_weight "
        "on values (grad_weight_dy's sr_prescale 0.75 (dequantized values are not q * 2^e))"
    )
    assert summary("wang-fp4", "fast") == (
        "quantized layers: 2 on the vector-wise executor; "
        "gemm fast: forward on values (forward_x's block 'row' (mxfp4_matmul takes multiples of "
        "32 up to 256)); grad_input, grad_weight on FP8 tensor cores (torch._scaled_mm; "
        "elsewhere on values)"
    )


BLOCK_SCALED = {
    "nvfp4": CONFIGS["nvfp4"],  # 2-D weight tiles, SR on dY, RHT-16 on the weight gradient
    "nvidia-nvfp4": load_recipe("nvidia-nvfp4").linear,
    "nvfp4-ceil-sr-weights": CONFIGS["nvfp4-ceil-sr-weights"],
    "ue5m3-hadamard-sr": CONFIGS["ue5m3-hadamard-sr"],  # UE5M3 per 32, RHT-32 on every GEMM
    "ufp4": load_recipe("ufp4").linear,  # E1M2 elements in NVFP4's layout, RHT-16 everywhere
    "nvfp4-4over6": load_recipe("nvfp4-4over6").linear,  # scales to 4 or 6; S = 256
}


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("name", BLOCK_SCALED)
def test_block_scaled_products_are_the_same_bits_on_both_executors(name, mode):
    config = with_gemm(BLOCK_SCALED[name], mode)
    assert [gemm_route(config, g) for g in ("forward", "grad_input", "grad_weight")] == [
        "block"
    ] * 3
    fast, reference, x, grad_y = routed_pair(config)
    assert fast.executor() == ("fast", "")
    # one pass: each pass drawing its own seeds is the executors' tests' (test_linear_fast.py)
    got, expected = (training_passes(layer, x, grad_y, calls=1) for layer in (fast, reference))
    assert_same_passes(got, expected, summed_bias=True)
    # and not the dequantized values' product (each value rounded before the GEMM)
    plain_config = with_gemm(BLOCK_SCALED[name], "dequantized")
    plain = training_passes(seeded_layer(plain_config, "torch"), x, grad_y, calls=1)
    assert not torch.equal(got[0][0], plain[0][0])
    for a, b in zip(got[0][:3], plain[0][:3], strict=True):
        assert_same_sum(a, b)


def test_block_scaled_ragged_shapes_on_both_executors():
    config = with_gemm(CONFIGS["nvfp4"], "exact")
    fast, reference, x, grad_y = routed_pair(config, (19, 45), 33, seed=2)
    got, expected = training_passes(fast, x, grad_y), training_passes(reference, x, grad_y)
    assert_same_passes(got, expected, summed_bias=True)


def test_block_scaled_forward_is_nvfp4_matmuls_contract():
    """y = fl32(alpha * sum (q_x s_x)(q_w s_w)) + b: nvfp4_matmul_reference's formula (sums in
    float64) on the reference quantizer's tensors, to float32 summation order."""
    config = LinearConfig(forward_x=NVFP4, forward_w=NVFP4, gemm="exact")
    layer = seeded_layer(config, "torch", bias=False)
    x, _ = linear_inputs((37, 96), seed=8)
    y = layer(x)
    expected = nvfp4_matmul_reference(
        quantize(x.detach(), NVFP4, 1, backend="torch"),
        quantize(layer.weight.detach(), NVFP4, 1, backend="torch"),
        torch.float32,
    )
    assert_same_sum(y.detach(), expected)


def test_block_values_of_a_quantized_tensor():
    """q * s: the dequantized values of a one-level spec; of a two-level one, without the
    tensor scale (kernel and reference alike)."""
    x = linear_inputs((40, 64), seed=9)[0].detach()
    one_level = quantize(x, MXFP4, backend="torch")
    assert torch.equal(one_level.block_values(), one_level.dequantize())
    for spec in (NVFP4, QuantSpec.preset("nvfp4-2d")):
        two_level = quantize(x, spec, backend="torch")
        scales = two_level.scale_values()
        if spec.tile2d:
            scales = scales.repeat_interleave(16, 0)
        q_times_s = two_level.element_values() * scales.repeat_interleave(16, -1)
        assert torch.equal(two_level.block_values(), q_times_s[:40, :64])
    kernel = quantize(x, NVFP4, backend="triton")
    assert_same_up_to_zero_sign(
        kernel.block_values(torch.float32, "triton"),
        quantize(x, NVFP4, backend="torch").block_values(torch.float32, "torch"),
        "block values",
    )


def test_block_route_gaps():
    doubled = LinearConfig(forward_x=NVFP4, forward_w=NVFP4, double_quant=True, gemm="exact")
    assert gemm_gap(doubled, "forward") == (
        "double quantization (it re-quantizes the forward operands' values)"
    )
    assert gemm_gap(with_gemm(load_recipe("ue5m3-hadamard-sr").linear, "exact"), "forward") is None
    mixed = LinearConfig(forward_x=NVFP4, forward_w=MXFP4, gemm="fast")
    assert gemm_gap(mixed, "forward").startswith("forward_w's e2m1/e8m0/32")
    assert gemm_gap(mixed, "forward").endswith("(block-scaled products take one tensor scale)")
    e4m3 = QuantSpec(element="e4m3", scale="ue4m3", block=16, tensor_scale=True)
    other = LinearConfig(forward_x=NVFP4, forward_w=e4m3, gemm="exact")
    assert gemm_gap(other, "forward") == (
        "forward_w's e4m3/ue4m3 (block-scaled products take e2m1 or e1m2 with ue4m3 or ue5m3)"
    )
    outer = LinearConfig(forward_x=NVFP4, forward_w=QuantSpec.preset("nvfp4-outer128"),
                         gemm="exact")  # fmt: skip
    assert "one tensor scale" in gemm_gap(outer, "forward")


def test_executor_summary_names_the_block_scaled_products():
    from fp4cli.linear import executor_summary

    model = torch.nn.Sequential(torch.nn.Linear(32, 32)).to(DEVICE)
    quantize_model(model, with_gemm(CONFIGS["nvfp4"], "exact"), seed=0, skip=(), backend="torch")
    assert executor_summary(model) == (
        "quantized layers: 1 on the reference (backend torch); "
        "gemm exact: forward, grad_input, grad_weight as block-scaled products"
    )


def test_block_scaled_mm_without_kernels_gives_the_kernels_bits(monkeypatch):
    """Where no kernel runs (a CPU without the interpreter), torch computes the same product:
    the same float32 GEMM, then alpha from `block_scaled_alpha`, the bias and one rounding."""
    import fp4cli.gemm.nvfp4 as nvfp4

    generator = torch.Generator().manual_seed(13)
    a = torch.randn(37, 48, generator=generator).to(DEVICE)
    b = torch.randn(48, 21, generator=generator).to(DEVICE)
    amaxes = (torch.tensor(3.7, device=DEVICE), torch.tensor([12.5], device=DEVICE))
    factor = 2688.0**2
    bias = torch.randn(21, generator=generator).to(DEVICE)
    with_kernels = nvfp4.block_scaled_mm(a, b, amaxes, factor, torch.float32)
    with_bias = nvfp4.block_scaled_mm(a, b, amaxes, factor, torch.float32, bias)
    monkeypatch.setattr(nvfp4, "triton_available", lambda: False)
    without = nvfp4.block_scaled_mm(a, b, amaxes, factor, torch.float32)
    assert torch.equal(with_kernels, without)
    assert not torch.equal(without, a @ b)
    # the bias joins fl32(alpha * sum) in float32 before the rounding, as Blackwell's epilogue
    without_bias_kernels = nvfp4.block_scaled_mm(a, b, amaxes, factor, torch.float32, bias)
    assert torch.equal(with_bias, without_bias_kernels)
    assert torch.equal(with_bias, without + bias)
    half = nvfp4.block_scaled_mm(a, b, amaxes, factor, torch.float16, bias)
    assert torch.equal(half, (without + bias).half())
