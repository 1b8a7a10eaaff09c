"""The vector-wise executor's FP8 route (`linear.gemm: fast`, fp4cli/gemm/fp8.py): which GEMMs
take it, the transposed codes `quantize_codes` writes for it against the reference quantizer,
the layer against the reference executor (on the CPU `fp8_mm` multiplies the decoded values,
so bit for bit; the tensor cores' sums are checked by tests/gpu/test_gpu_fast_vector.py), what
it keeps for the backward pass, and the summary `fp4 train` prints."""

import dataclasses

import pytest
import torch

from fp4cli import LinearConfig, QuantSpec, quantize_model
from fp4cli.gemm.fp8 import fp8_mm
from fp4cli.kernels.vector.launch import decode_vector, quantize_codes, quantize_vector
from fp4cli.linear import executor_summary
from fp4cli.linear.routes import gemm_gap
from fp4cli.quant import fake_quantize
from tests.kernel_cases import DEVICE, INF, assert_bits
from tests.kernels.test_vector_wise import edge_tensor
from tests.linear_runs import (
    assert_same_passes,
    linear_inputs,
    saved_tensors,
    seeded_layer,
    training_passes,
)
from tests.train.test_fast_vector import CONFIGS

E4M3, E5M2 = QuantSpec.preset("fp8-e4m3-tensor"), QuantSpec.preset("fp8-e5m2-tensor")
E4M3_COLUMN = QuantSpec(element="e4m3", block="column")


def fast(config: LinearConfig) -> LinearConfig:
    return dataclasses.replace(config, gemm="fast")


FP8_CONFIGS = {
    "wang-fp4": fast(CONFIGS["wang-fp4"]),
    "wang-direct": fast(CONFIGS["wang-direct"]),
    "single-quantization": fast(CONFIGS["single-quantization"]),
    # every GEMM on the route: FP8 forward operands (no double quantization)
    "fp8-all": LinearConfig(
        forward_x=E4M3,
        forward_w=E4M3,
        grad_input_dy=E5M2,
        grad_input_w=E4M3,
        grad_weight_dy=E5M2,
        grad_weight_x=E4M3,
        gemm="fast",
    ),  # fmt: skip
    # grad_weight on the route, grad_input on values (W per column): dY quantized twice
    "mixed": fast(dataclasses.replace(CONFIGS["wang-fp4"], grad_input_w=E4M3_COLUMN)),
}


def test_which_gemms_take_the_route_and_why_not():
    wang = FP8_CONFIGS["wang-fp4"]
    assert wang.routes == {"forward": None, "grad_input": "fp8", "grad_weight": "fp8"}
    assert FP8_CONFIGS["fp8-all"].routes == dict.fromkeys(
        ("forward", "grad_input", "grad_weight"), "fp8"
    )
    exact = dataclasses.replace(wang, gemm="exact")
    assert exact.routes["grad_input"] is None
    assert gemm_gap(exact, "grad_input") == (
        "FP8 operands: their values' product is exact (the FP8 tensor cores: gemm fast)"
    )
    both_e5m2 = dataclasses.replace(wang, grad_input_w=E5M2)
    assert gemm_gap(both_e5m2, "grad_input") == (
        "two e5m2 operands (the FP8 tensor cores pair e5m2 with e4m3 only)"
    )
    assert gemm_gap(FP8_CONFIGS["mixed"], "grad_input") == (
        "grad_input_w's 'column' e8m0 scales (the FP8 route: one e8m0 per tensor)"
    )
    doubled = dataclasses.replace(FP8_CONFIGS["fp8-all"], double_quant=True)
    assert gemm_gap(doubled, "forward") == (
        "double quantization (it re-quantizes the forward operands' values)"
    )
    prescaled = dataclasses.replace(
        wang, grad_weight_x=dataclasses.replace(E4M3, rounding="sr", sr_prescale=0.75)
    )
    assert gemm_gap(prescaled, "grad_weight") == (
        "grad_weight_x's sr_prescale 0.75 (values are not code * scale)"
    )


@pytest.mark.parametrize(
    ("spec", "axis"),
    [(E4M3, 0), (E4M3, 1), (E5M2, 0), (E5M2, 1), (E4M3_COLUMN, 1)],  # E4M3_COLUMN along 0: rows
    ids=["e4m3-0", "e4m3-1", "e5m2-0", "e5m2-1", "e4m3-column-1"],
)
@pytest.mark.parametrize("shape", [(37, 45), (8, 9), (70, 17)])
def test_transposed_codes_are_the_reference_codes(spec, axis, shape):
    """Both layouts of `quantize_codes` hold `quantize_vector`'s codes (which decode to the
    reference's values: tests/kernels/test_vector_wise.py), edge values included."""
    x = edge_tensor(*shape)
    codes, scales = quantize_vector(x, spec, axis, None, scales=True)
    rows, transposed, both_scales = quantize_codes(x, spec, axis, rows_out=True, transposed=True)
    assert torch.equal(rows, codes) and torch.equal(transposed, codes.t())
    assert transposed.is_contiguous() and transposed.dtype == torch.uint8
    assert_bits(both_scales, scales, "scales")
    only_t = quantize_codes(x, spec, axis, rows_out=False, transposed=True)
    assert only_t[0] is None and torch.equal(only_t[1], codes.t())
    decoded = decode_vector(transposed, scales, spec, 1 - axis, x.dtype).t()
    assert_bits(decoded, fake_quantize(x, spec, axis=axis, backend="torch"), "decoded")


def test_quantize_codes_refuses_row_scales_and_no_layout():
    x = torch.ones(4, 4, device=DEVICE)
    with pytest.raises(ValueError, match="column or tensor scales"):
        quantize_codes(x, QuantSpec(element="e4m3", block="row"), 1, rows_out=True, transposed=True)
    with pytest.raises(ValueError, match="codes in some layout"):
        quantize_codes(x, E4M3, 1, rows_out=False, transposed=False)


def test_fp8_mm_off_the_tensor_cores_is_the_values_product():
    a, b = edge_tensor(16, 32, seed=1), edge_tensor(24, 32, seed=2)
    a[1:3], b[1:3] = torch.randn(2, 32), torch.randn(2, 32)  # finite, so most outputs are
    a_codes, _, a_scale = quantize_codes(a, E5M2, 1, rows_out=True, transposed=False)
    b_codes, _, b_scale = quantize_codes(b, E4M3, 1, rows_out=True, transposed=False)
    bias = torch.randn(24, device=DEVICE)
    got = fp8_mm((a_codes, a_scale), (b_codes, b_scale), (E5M2, E4M3), torch.float32, bias)
    a_values = fake_quantize(a, E5M2, axis=1, backend="torch")
    b_values = fake_quantize(b, E4M3, axis=1, backend="torch")
    assert_bits(got, torch.nn.functional.linear(a_values, b_values, bias), "product")
    a[0, 0] = INF  # a non-finite operand: its scale is NaN, and so is every output
    codes, _, nan_scale = quantize_codes(a, E5M2, 1, rows_out=True, transposed=False)
    assert nan_scale.isnan().all()
    product = fp8_mm((codes, nan_scale), (b_codes, b_scale), (E5M2, E4M3), torch.float32)
    assert product.isnan().all()


@pytest.mark.parametrize("name", FP8_CONFIGS)
def test_the_route_gives_the_reference_bits_off_the_tensor_cores(name):
    if torch.device(DEVICE).type == "cuda":  # the tensor cores sum in their own order there
        pytest.skip("bit for bit off the tensor cores only (tests/gpu/test_gpu_fast_vector.py)")
    config = FP8_CONFIGS[name]
    vector, reference = seeded_layer(config, "triton"), seeded_layer(config, "torch")
    assert vector.executor() == ("vector", "")
    x, grad_y = linear_inputs(outlier=True)
    assert_same_passes(
        training_passes(vector, x, grad_y),
        training_passes(reference, x, grad_y),
        summed_bias=True,
    )


def test_ragged_shapes_no_bias_and_frozen_weights():
    config = FP8_CONFIGS["wang-fp4"]
    x, grad_y = linear_inputs((19, 45), 33, seed=2, outlier=True)
    for bias in (True, False):
        layers = [seeded_layer(config, backend, 45, 33, bias) for backend in ("triton", "torch")]
        passes = [training_passes(layer, x, grad_y) for layer in layers]
        assert_same_passes(*passes, summed_bias=bias)
        for layer in layers:
            layer.weight.requires_grad_(False)
        frozen = [training_passes(layer, x, grad_y) for layer in layers]
        assert_same_passes(*frozen, summed_bias=bias)


def _saved(layer, x):
    return sorted((tuple(t.shape), t.dtype) for t in saved_tensors(layer, x))


def test_x_and_w_are_kept_as_their_transposes_codes():
    """On the route W's FP8 operand is kept as one byte a value (of W^T, (in, out)) instead of
    float32 values, X's as X^T's codes: what the tensor cores read, K contiguous."""
    x, _ = linear_inputs(seed=6, outlier=True)
    assert _saved(seeded_layer(FP8_CONFIGS["wang-fp4"], "triton"), x) == sorted(
        [
            ((96, 74), torch.uint8),  # X^T's codes
            ((1,), torch.float32),
            ((96, 70), torch.uint8),  # W^T's codes
            ((1,), torch.float32),
            ((70, 96), torch.float32),  # the weight, for DGE
            ((96,), torch.float32),  # its forward scales
        ]
    )


def test_the_train_summary_names_the_route():
    def summary(config):
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16)).to(DEVICE)
        quantize_model(model, config, seed=0, skip=(), backend="triton")
        return executor_summary(model)

    assert summary(FP8_CONFIGS["wang-fp4"]) == (
        "quantized layers: 2 on the vector-wise executor; gemm fast: forward on values "
        "(forward_x's block 'row' (mxfp4_matmul takes multiples of 32 up to 256)); grad_input, "
        "grad_weight on FP8 tensor cores (torch._scaled_mm; elsewhere on values)"
    )
    model = torch.nn.Sequential(torch.nn.Linear(32, 32)).to(DEVICE)
    quantize_model(model, FP8_CONFIGS["wang-fp4"], seed=0, skip=(), backend="torch")
    assert executor_summary(model).endswith(
        "grad_input, grad_weight on values (FP8 tensor cores: the vector-wise executor's)"
    )
