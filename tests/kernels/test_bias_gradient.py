"""`linear.bias_gradient: quantized` (TetraJet's released code): the bias's gradient is the sum
of grad_input's quantized dY operand, on the reference executor by definition, and on the fast
executor from the pair kernel's read of dY (or a launch of its own where the operand's values
are block values), the same sums (interpreter on the CPU, or a GPU)."""

import dataclasses

import pytest
import torch

from fp4cli import LinearConfig, QuantSpec
from fp4cli.linear.fast_vector import vector_gap
from fp4cli.linear.function import seed_offsets
from fp4cli.quant import SpecError, fake_quantize
from fp4cli.recipes import load_recipe
from fp4cli.techniques import HadamardConfig
from tests.kernel_cases import DEVICE
from tests.kernel_checks import assert_bits
from tests.linear_runs import linear_inputs, seeded_layer, training_passes

TETRAJET = load_recipe("tetrajet").linear
NVFP4 = QuantSpec.preset("nvfp4")
CONFIGS = {
    "tetrajet": TETRAJET,  # values for the GEMM: summed in the pair kernel
    "tetrajet-exact": dataclasses.replace(TETRAJET, gemm="exact"),  # packed codes: likewise
    # a two-level dY on the block-scaled route (block values): summed from a launch of its own
    "nvfp4-block": LinearConfig(
        forward_x=NVFP4,
        forward_w=NVFP4,
        grad_input_dy=NVFP4.replace(rounding="sr"),
        grad_input_w=NVFP4,
        gemm="exact",
        bias_gradient="quantized",
    ),  # fmt: skip
}


def _integer_gradients(shape=(3, 41, 96), out_features=70):
    """dY of integers: its quantized values are multiples of small powers of two, so their
    float32 sums come out the same in every order, and the executors must agree bit for bit."""
    x, _ = linear_inputs(shape, out_features, seed=6)
    generator = torch.Generator().manual_seed(6)
    grad_y = torch.randint(-64, 65, (*shape[:-1], out_features), generator=generator)
    return x, grad_y.float().to(DEVICE)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_bias_gradient_sums_grad_inputs_quantized_dy(name):
    config = CONFIGS[name]
    x, grad_y = _integer_gradients()
    layers = [seeded_layer(config, backend) for backend in ("triton", "torch")]
    (fast,), (reference,) = [training_passes(layer, x, grad_y, calls=1) for layer in layers]
    assert layers[0].executor() == ("fast", "")
    assert_bits(fast[-1], reference[-1], "bias gradient")
    # by definition: grad_input's dY operand (its seed: the layer's first call's) summed
    call_seed = layers[1].rng_seed.to(torch.int64)
    seed = call_seed + seed_offsets("grad_input", ("grad_input_dy", "grad_input_w"))[0]
    dy = grad_y.reshape(-1, grad_y.shape[-1])
    operand = fake_quantize(dy, config.grad_input_dy, 1, seed, backend="torch")
    assert_bits(reference[-1], operand.sum(0, dtype=torch.float32), "bias gradient")
    assert not torch.equal(reference[-1], dy.sum(0))  # not dY's own sums


def test_without_the_input_gradient_the_bias_still_sums_the_quantized_dy():
    x, grad_y = _integer_gradients()
    x.requires_grad_(False)
    passes = []
    for backend in ("triton", "torch"):
        layer = seeded_layer(TETRAJET, backend)
        layer.weight.requires_grad_(False)
        passes.append(training_passes(layer, x, grad_y, calls=1)[0][-1])
    assert_bits(passes[0], passes[1], "bias gradient")


def test_the_option_is_checked_and_resolved():
    assert load_recipe("tetrajet").to_dict()["linear"]["bias_gradient"] == "quantized"
    assert load_recipe("tetrajet-qema").linear.bias_gradient == "quantized"
    assert "bias_gradient" not in load_recipe("mxfp4").to_dict()["linear"]  # the default: dy
    assert "bias_gradient=quantized" in TETRAJET.summary()
    with pytest.raises(SpecError, match="bias_gradient: must be one of dy, quantized"):
        LinearConfig(bias_gradient="q3")
    with pytest.raises(SpecError, match="needs grad_input.dy quantized"):
        LinearConfig(forward_x=NVFP4, bias_gradient="quantized")
    with pytest.raises(SpecError, match="without a Hadamard transform"):
        dataclasses.replace(TETRAJET, grad_input_hadamard=HadamardConfig(32))
    wang = dataclasses.replace(load_recipe("wang-direct").linear, bias_gradient="quantized")
    assert vector_gap(wang) == "a bias gradient from the quantized dY"


def test_the_pair_kernel_sums_the_row_values():
    from fp4cli.kernels.quantization.launch_pair import Direction, quantize_pair

    spec = QuantSpec.preset("mxfp4-ceil", rounding="sr")
    _, grad_y = _integer_gradients((1, 70, 96), 45)
    dy = grad_y[0]
    sums = torch.empty(45, dtype=torch.float32, device=DEVICE)
    row, col = Direction(spec, 7, values_dtype=torch.float32), Direction(spec, 8)
    row_out, _ = quantize_pair(dy, row, col, column_sums=sums, sum_row_values=torch.float32)
    assert_bits(sums, row_out.values.sum(0), "sums of the row values")
    with pytest.raises(ValueError, match="sum_row_values sums the row direction's whole values"):
        quantize_pair(dy, None, col, column_sums=sums, sum_row_values=torch.float32)
    with pytest.raises(ValueError, match="round to one dtype"):
        quantize_pair(dy, row, col, torch.bfloat16, column_sums=sums, sum_row_values=torch.float32)
